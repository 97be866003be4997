"""An FSDP2 actor's weight sync into the engine layout: every engine region bit-exact, bytes received =
the plan's floor, the naive all-gather (w−1)/w of the model; and a real vLLM engine fed by it.

The region/bytes checks run in the shared 4-rank launch (tests/multiproc/conftest.py) as part
"fsdp_sync" (tests/multiproc/fsdp_sync_checks.py): tiny Qwen2 (tied embeddings, q/k/v biases) and Llama
(untied), vocab 1001 chunked unevenly over 4 FSDP ranks, at rollout.tp 1, 2 and 4 (4 > 2 key/value
heads: each is replicated on 2 engine ranks). The engine check is part "fsdp_sync_engine" of the shared
2-rank launch.
"""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

MODELS = ["qwen2", "llama"]
CASES = ["tg1", "tg2", "tg4"]

SHARED_PART = (
    "fsdp_sync",
    "tests.multiproc.fsdp_sync_checks",
    lambda request: [request.getfixturevalue("tiny_models")[m] for m in MODELS],
)


@pytest.fixture(scope="module")
def sync(shared_launch):
    return shared_result(shared_launch, "fsdp_sync")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", CASES + [c + "-naive" for c in CASES])
def test_every_engine_region_equals_the_full_weights(sync, model, case):
    result = sync[model][case]
    assert result["max_abs_diff"] == 0.0
    # every HF parameter once (a tied lm_head is the embedding: vLLM's loader skips lm_head.weight)
    assert sorted(result["names"]) == result["expected_names"]
    assert len(result["names"]) == len(set(result["names"]))
    assert result["split_layers"] == []  # q/k/v and gate/up always share a bucket


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", CASES)
def test_each_rank_receives_exactly_the_plan_floor(sync, model, case):
    result = sync[model][case]
    assert result["received"] == result["floor"]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", CASES)
def test_naive_all_gather_receives_what_each_rank_lacks_of_the_whole_model(sync, model, case):
    naive, m = sync[model][case + "-naive"], sync[model]["model_bytes"]
    assert naive["received"] == [m - own for own in naive["own_bytes"]]
    assert sum(naive["received"]) == (4 - 1) * m  # (w−1)/w·M per rank on average


def test_floor_shrinks_with_rollout_tp(sync):
    for model in MODELS:
        floors = [sum(sync[model][c]["floor"]) for c in CASES]
        # rollout.tp=1: every rank lacks (w−1)/w of the model; each larger rollout.tp needs less
        assert floors[0] == 3 * sync[model]["model_bytes"] and floors[0] > floors[1] > floors[2], floors
    assert sync["qwen2"]["tied"] and not sync["llama"]["tied"]


SHARED_PART_2 = (
    "fsdp_sync_engine",
    "tests.multiproc.fsdp_sync_checks:engine",
    lambda request: [request.getfixturevalue("tiny_models")["qwen2"]],
)


@pytest.fixture(scope="module")
def engine(shared_launch_2) -> dict:
    return shared_result(shared_launch_2, "fsdp_sync_engine")


def test_engine_fed_by_the_sync_generates_as_transformers(engine):
    result = engine["tg2"]
    assert result["ratio"] == 1.0
    # the engine read only each rank's region: everything else was NaN
    assert result["log_prob_diff"] <= 2e-5, result
    assert result["original_diff"] > 1e-2, result  # the start-up weights were replaced
    assert result["loaders"] == ["reload_weights"]
