"""The architectures only the FSDP backend trains (Phi-3, Gemma 2) run in megarl's vLLM engine as in
transformers: greedy tokens equal, log-probs within fp32 noise, before and after a weight push by Hugging
Face names. One part of the shared 1-rank launch (tests/multiproc/conftest.py) builds both models and
starts one engine after the other; it also holds megarl.fsdp.checks' reading of vLLM's registry against the
imported registry."""

from __future__ import annotations

import pytest

from megarl.models.tiny import HF_ONLY_FAMILIES
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

LOG_PROB_TOL = 1e-4  # measured ≤ 5e-6 (fp32, different op order); see tests/multiproc/test_vllm_rollout.py


SHARED_PART_1 = (
    "tiny_archs",
    "tests.multiproc.tiny_arch_checks",
    lambda request: [
        request.getfixturevalue("tmp_path_factory").mktemp("hf_only_families"),
        *sorted(HF_ONLY_FAMILIES),
    ],
)


@pytest.fixture(scope="module")
def checks(shared_launch_1) -> dict:
    return shared_result(shared_launch_1, "tiny_archs")


@pytest.mark.parametrize("family", sorted(HF_ONLY_FAMILIES))
@pytest.mark.parametrize("weights", ["built", "pushed"])
def test_engine_greedy_tokens_equal_transformers(checks, family, weights):
    result = checks[family][weights]
    assert result["greedy_tokens"] == result["hf_greedy_tokens"]


@pytest.mark.parametrize("family", sorted(HF_ONLY_FAMILIES))
@pytest.mark.parametrize("weights", ["built", "pushed"])
def test_engine_log_probs_match_transformers(checks, family, weights):
    result = checks[family][weights]
    assert result["greedy_log_prob_diff"] < LOG_PROB_TOL
    assert result["sampled_log_prob_diff"] < LOG_PROB_TOL


@pytest.mark.parametrize("family", sorted(HF_ONLY_FAMILIES))
def test_pushed_weights_change_the_engine(checks, family):
    built, pushed = checks[family]["built"], checks[family]["pushed"]
    assert pushed["greedy_tokens"] != built["greedy_tokens"]
    assert checks[family]["push_loader"] in ("layers", "reload_weights")


def test_checks_read_vllms_registry_as_vllm_imports_it(checks):
    assert checks["registry_read_matches"] == {"native": True, "fallback": True}
