"""Rollout rows -> padded or packed micro-batches, and the index that maps outputs back."""

import pytest
import torch

from megarl.algorithms.aggregate import aggregate
from megarl.protocol import Batch, Col
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


def _multi_turn_batch() -> Batch:
    # row 0: prompt [5, 6], response [7, 8, 9, 1] of which 8 and 9 are a tool's output (read, not sampled);
    # row 1: prompt [4], response [3] then padding
    batch = Batch(
        tensors={
            Col.INPUT_IDS: torch.tensor([[5, 6, 7, 8, 9, 1], [0, 4, 3, 0, 0, 0]]),
            Col.ATTENTION_MASK: torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 0]]),
            Col.RESPONSE_MASK: torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]]),
        }
    )
    batch[Col.RESPONSES] = batch[Col.INPUT_IDS][:, 2:]
    return batch


@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_tokens_the_rollout_masks_out_are_read_but_never_trained_on(mode):
    seqs = sequences_from_batch(_multi_turn_batch())
    # the tool output stays in the sequence the model reads...
    assert [t.tolist() for t in seqs.tokens] == [[5, 6, 7, 8, 9, 1], [4, 3]]
    mb = build_microbatch(seqs, [0, 1], mode, length=8, rows_per_mb=2)
    assert mb["input_ids"].flatten()[:6].tolist() == [5, 6, 7, 8, 9, 1]
    assert mb["labels"].flatten()[mb["index"][0]].tolist() == [7, 8, 9, 1]
    # ...but the loss mask is the rollout's, and so are the token counts that normalise a loss
    assert mb["mask"].tolist() == [[1, 0, 0, 1], [1, 0, 0, 0]]
    assert seqs.response_lens == [2, 1]
    token_losses = torch.tensor([[1.0, 100.0, 100.0, 3.0], [5.0, 0.0, 0.0, 0.0]])
    loss = aggregate(token_losses, mb["mask"], "token-mean", num_tokens=sum(seqs.response_lens))
    assert loss.item() == pytest.approx(3.0)


def test_without_response_mask_the_attended_response_tokens_are_trained_on():
    batch = _multi_turn_batch()
    seqs = sequences_from_batch(batch.select([k for k in batch.keys() if k != Col.RESPONSE_MASK]))
    assert seqs.loss_mask.tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]] and seqs.response_lens == [4, 1]


def test_a_response_mask_on_padding_is_rejected():
    batch = _multi_turn_batch()
    batch[Col.RESPONSE_MASK][1, 2] = 1.0
    with pytest.raises(ValueError, match="response_mask is 1 on padding"):
        sequences_from_batch(batch)


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


def test_packing_places_the_longest_first_and_keeps_the_rows_order_of_outputs():
    seqs = sequences_from_batch(_batch())
    mb = build_microbatch(seqs, [1, 0], "pack", length=8, thd=True)
    assert mb["input_ids"].tolist() == [[5, 6, 7, 8, 9, 4, 3, 0]]  # row 0 (5 tokens) before row 1 (2)
    assert mb["cu_seqlens"].tolist() == [0, 5, 7, 8]  # the trailing padding is one more sequence
    flat_labels = mb["labels"].flatten()
    assert flat_labels[mb["index"][0, :1]].tolist() == [3]  # output k=0 is still row 1's
    assert flat_labels[mb["index"][1, :3]].tolist() == [7, 8, 9]
    assert mb["last_index"].tolist() == [6, 4]


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
