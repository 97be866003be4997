"""The rollout schema: prompt extraction from left padding and assembling sampled responses."""

from __future__ import annotations

import pytest
import torch

from megarl.protocol import Batch
from megarl.rollout.base import ROLLOUT_COLUMNS, Sample, prompt_token_ids, rollout_batch

pytestmark = pytest.mark.unit

PAD = 0


def prompts(extra: dict | None = None) -> Batch:
    ids = torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10]])
    tensors = {"prompts": ids, "attention_mask": (ids != PAD).long(), **(extra or {})}
    return Batch(tensors, {"question": ["q0", "q1"]}, {"step": 3})


def samples() -> list[list[Sample]]:
    return [
        [Sample([11, 12, 13], [-0.5, -1.0, -1.5], "length"), Sample([14], [-0.25], "stop")],
        [Sample([15, 2], [-2.0, -3.0], "stop"), Sample([16, 17, 18], [-0.1, -0.2, -0.3], "length")],
    ]


def test_prompt_token_ids_drop_left_padding():
    assert prompt_token_ids(prompts()) == [[5, 6], [7, 8, 9, 10]]


@pytest.mark.parametrize(
    "mask",
    [[[1, 1, 0, 0], [1, 1, 1, 1]], [[0, 1, 0, 1], [1, 1, 1, 1]], [[0, 0, 0, 0], [1, 1, 1, 1]]],
    ids=["right_padded", "holes", "empty"],
)
def test_prompt_token_ids_reject_rows_that_are_not_left_padded(mask):
    batch = Batch({"prompts": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.tensor(mask)})
    with pytest.raises(ValueError, match=r"prompt rows \[0\]"):
        prompt_token_ids(batch)


def test_rollout_batch_builds_verl_schema():
    out = rollout_batch(prompts(), samples(), max_tokens=3, pad_token_id=PAD)
    assert len(out) == 4 and set(ROLLOUT_COLUMNS) <= set(out.keys())
    assert out["responses"].tolist() == [[11, 12, 13], [14, 0, 0], [15, 2, 0], [16, 17, 18]]
    assert out["response_mask"].tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert out["response_mask"].dtype == torch.float32
    assert out["rollout_log_probs"].dtype == torch.float32
    torch.testing.assert_close(out["rollout_log_probs"][1], torch.tensor([-0.25, 0.0, 0.0]), rtol=0, atol=0)
    assert out["prompts"].tolist() == [[0, 0, 5, 6]] * 2 + [[7, 8, 9, 10]] * 2
    assert out["input_ids"].tolist()[1] == [0, 0, 5, 6, 14, 0, 0]
    assert out["attention_mask"].tolist()[1] == [0, 0, 1, 1, 1, 0, 0]
    assert out["uid"].tolist() == [0, 0, 1, 1]
    assert list(out["finish_reason"]) == ["length", "stop", "stop", "length"]


def test_rollout_batch_without_log_probs_has_no_log_prob_column():
    bare = [[Sample(s.token_ids, None, s.finish_reason) for s in row] for row in samples()]
    out = rollout_batch(prompts(), bare, max_tokens=3, pad_token_id=PAD)
    assert set(out.keys()) >= set(ROLLOUT_COLUMNS) and "rollout_log_probs" not in out.keys()
    assert out["responses"].tolist() == [[11, 12, 13], [14, 0, 0], [15, 2, 0], [16, 17, 18]]
    bare[1][0] = samples()[1][0]
    with pytest.raises(ValueError, match="every sample has its log-probs or none"):
        rollout_batch(prompts(), bare, max_tokens=3, pad_token_id=PAD)


def test_rollout_batch_carries_other_columns_and_meta_per_sample():
    out = rollout_batch(prompts({"index": torch.tensor([40, 41])}), samples(), 3, PAD)
    assert out["index"].tolist() == [40, 40, 41, 41]
    assert list(out["question"]) == ["q0", "q0", "q1", "q1"]
    assert out.meta == {"step": 3}


def test_rollout_batch_keeps_a_given_uid():
    batch = prompts()
    batch["uid"] = ["a", "b"]
    assert list(rollout_batch(batch, samples(), 3, PAD)["uid"]) == ["a", "a", "b", "b"]


def test_rollout_batch_rejects_inconsistent_samples():
    with pytest.raises(ValueError, match="exceed max_tokens=2"):
        rollout_batch(prompts(), samples(), max_tokens=2, pad_token_id=PAD)
    with pytest.raises(ValueError, match="same number of samples"):
        rollout_batch(prompts(), [samples()[0], samples()[1][:1]], 3, PAD)
    with pytest.raises(ValueError, match="samples for 1 prompts"):
        rollout_batch(prompts(), samples()[:1], 3, PAD)


def test_rollout_batch_carries_token_versions_and_each_rows_oldest():
    versions = [[[3, 3, 4], [4]], [[4, 5], [5, 5, 5]]]
    tagged = [
        [Sample(s.token_ids, s.log_probs, s.finish_reason, v) for s, v in zip(row, vs)]
        for row, vs in zip(samples(), versions)
    ]
    out = rollout_batch(prompts(), tagged, max_tokens=3, pad_token_id=PAD)
    assert out["rollout_token_versions"].tolist() == [[3, 3, 4], [4, -1, -1], [4, 5, -1], [5, 5, 5]]
    assert out["rollout_token_versions"].dtype == torch.long
    assert out["rollout_version"].tolist() == [3, 4, 4, 5]
    assert "rollout_version" not in rollout_batch(prompts(), samples(), 3, PAD).keys()


def test_rollout_batch_refuses_versions_that_do_not_fit_the_tokens():
    tagged = [
        [Sample(s.token_ids, s.log_probs, s.finish_reason, [0] * len(s.token_ids)) for s in row]
        for row in samples()
    ]
    tagged[1][1] = Sample([16, 17, 18], None, "length", [0, 0])
    with pytest.raises(ValueError, match="every sample has its log-probs or none"):
        rollout_batch(prompts(), tagged, 3, PAD)
    tagged[1][1] = Sample([16, 17, 18], [-0.1, -0.2, -0.3], "length", [0, 0])
    with pytest.raises(ValueError, match=r"row 3: 2 token versions for 3 tokens"):
        rollout_batch(prompts(), tagged, 3, PAD)
    tagged[1][1] = Sample([16, 17, 18], [-0.1, -0.2, -0.3], "length")
    with pytest.raises(ValueError, match="every sample has its token versions or none"):
        rollout_batch(prompts(), tagged, 3, PAD)
