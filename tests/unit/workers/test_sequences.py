"""Rollout rows -> padded or packed micro-batches, and the index that maps outputs back."""

import pytest
import torch

from megarl.protocol import Batch
from megarl.workers.sequences import block_causal_mask, build_microbatch, scatter_rows, sequences_from_batch

pytestmark = pytest.mark.unit


def _batch() -> Batch:
    # row 0: prompt [5, 6] response [7, 8, 9]; row 1: prompt [4] response [3] (then padding)
    input_ids = torch.tensor([[0, 5, 6, 7, 8, 9], [0, 0, 4, 3, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]])
    return Batch(tensors={"input_ids": input_ids, "attention_mask": mask, "responses": input_ids[:, 3:]})


def test_sequences_keep_only_real_tokens():
    seqs = sequences_from_batch(_batch())
    assert [t.tolist() for t in seqs.tokens] == [[5, 6, 7, 8, 9], [4, 3]]
    assert seqs.prompt_lens == [2, 1] and seqs.response_lens == [3, 1] and seqs.response_width == 3


def test_padded_microbatch_index_points_at_the_predicting_position():
    seqs = sequences_from_batch(_batch())
    mb = build_microbatch(seqs, [0, 1], "pad", length=6, rows_per_mb=2)
    flat_inputs, flat_labels = mb["input_ids"].flatten(), mb["labels"].flatten()
    # the label at each indexed position is the response token it predicts
    assert flat_labels[mb["index"][0]].tolist() == [7, 8, 9]
    assert flat_labels[mb["index"][1, :1]].tolist() == [3]
    assert mb["mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert flat_inputs[mb["last_index"]].tolist() == [9, 3]
    assert "attention_mask" not in mb  # right padding: causal attention suffices


def test_packed_microbatch_restarts_positions_and_isolates_sequences():
    seqs = sequences_from_batch(_batch())
    mb = build_microbatch(seqs, [0, 1], "pack", length=8)
    assert mb["input_ids"].tolist() == [[5, 6, 7, 8, 9, 4, 3, 0]]
    assert mb["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 7]]
    assert mb["labels"].flatten()[mb["index"][1, :1]].tolist() == [3]
    blocked = mb["attention_mask"][0, 0]
    assert not blocked[6, 5] and blocked[6, 4]  # token 3 sees its prompt, not the first sequence
    assert blocked[5, 6]  # and never the future
    assert not blocked[7, 7]  # padding attends to itself only


def test_block_causal_mask_matches_a_hand_written_one():
    expected = torch.tensor(
        [[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 0, 1], [1, 1, 1, 0]], dtype=torch.bool
    )  # sequences of 2 and 1 tokens, one padding slot
    assert torch.equal(block_causal_mask([2, 1], 4)[0, 0], expected)


def test_scatter_rows_restores_batch_order():
    parts = [
        (torch.tensor([2, 0]), torch.tensor([[20.0], [0.0]])),
        (torch.tensor([1]), torch.tensor([[10.0]])),
    ]
    assert scatter_rows(parts, 3).flatten().tolist() == [0.0, 10.0, 20.0]


def test_holes_in_a_response_are_rejected():
    batch = _batch()
    batch["attention_mask"][0, 4] = 0
    with pytest.raises(ValueError, match="right end"):
        sequences_from_batch(batch)


def test_overfull_microbatches_are_rejected():
    seqs = sequences_from_batch(_batch())
    with pytest.raises(ValueError, match="do not fit"):
        build_microbatch(seqs, [0, 1], "pack", length=6)
    with pytest.raises(ValueError, match="do not fit"):
        build_microbatch(seqs, [0, 1], "pad", length=6, rows_per_mb=1)
