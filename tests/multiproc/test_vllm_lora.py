"""VLLMRollout with LoRA: adapters loaded from memory (`load_adapter`) against `peft` on the transformers
model, greedy token for token, on a tiny Llama in fp32; one rank, in the shared 1-rank launch
(tests/multiproc/vllm_lora_checks.py)."""

from __future__ import annotations

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

# fp32 checksums of the same values summed in another order; exact here (alpha / r = 2 is a power of two)
CHECKSUM_TOL = 1e-9


def _argv(request) -> list:
    return [request.getfixturevalue("tiny_models")["llama"]]


SHARED_PART_1 = ("vllm_lora", "tests.multiproc.vllm_lora_checks", _argv)


@pytest.fixture(scope="module")
def lora(shared_launch_1):
    return shared_result(shared_launch_1, "vllm_lora")


def test_engine_gets_one_adapter_slot_of_a_served_rank(lora):
    assert lora["engine_kwargs"] == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 1,
        "max_cpu_loras": 1,
        "lora_target_modules": None,
    }


def test_lora_engine_without_an_adapter_is_the_base_model(lora):
    assert lora["no_adapter"] == lora["hf"]["base"]


def test_adapter_from_memory_gives_peft_greedy_tokens_on_every_request_path(lora):
    assert lora["hf"]["first"] != lora["hf"]["base"]
    for path, tokens in lora["first"].items():
        assert tokens == lora["hf"]["first"], path


def test_second_adapter_replaces_the_first(lora):
    assert lora["hf"]["second"] != lora["hf"]["first"]
    for path, tokens in lora["second"].items():
        assert tokens == lora["hf"]["second"], path


def test_load_reports_size_and_leaves_the_callers_tensors_alone(lora):
    report = lora["load_first"]
    assert report["tensors"] == 4 * 7 * 2  # layers × projections × (A, B)
    assert report["bytes"] > 0 and report["seconds"] > 0
    assert lora["caller_tensors_unchanged"]


def test_engine_checksums_equal_the_adapters(lora):
    assert lora["first_checksums"]["names_equal"] and lora["first_checksums"]["n"] == 56
    assert lora["first_checksums"]["max_diff"] <= CHECKSUM_TOL
    assert lora["second_checksums_max_diff"] <= CHECKSUM_TOL
    assert lora["checksums_see_the_change"]


def test_base_weight_push_keeps_the_adapter(lora):
    assert lora["base_push_loader"] == "layers"
    assert lora["after_base_push"] == lora["hf"]["second"]


def test_tensor_of_a_module_the_engine_lacks_is_refused(lora):
    assert "qk_proj" in lora["unknown_module_error"]
