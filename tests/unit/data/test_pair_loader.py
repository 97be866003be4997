"""PairLoader: preference pairs as interleaved batches in PromptSampler's order, cycling over epochs,
resumable, and refusing a position saved for other pairs."""

from __future__ import annotations

import pytest

from megarl.data.loader import PairLoader
from megarl.data.preference import PreferencePair

pytestmark = pytest.mark.unit


def _pairs(n: int) -> list[PreferencePair]:
    return [PreferencePair(f"row {i}", [1, 2 + i], [10 + i, 0], [20 + i, 0]) for i in range(n)]


def _chosen(batch) -> list[int]:
    """Which pair each chosen row (rows 0, 2, …) comes from."""
    return [int(row[0]) - 10 for row in batch["responses"][0::2]]


def test_batches_interleave_chosen_and_rejected_and_cycle_over_epochs():
    loader = PairLoader(_pairs(5), batch_size=2, seed=3, pad_token_id=0)
    batches = [loader.next_batch() for _ in range(5)]
    assert all(len(b) == 4 for b in batches)
    for b in batches:
        assert [int(r[0]) for r in b["responses"][1::2]] == [i + 20 for i in _chosen(b)]
    first_epoch = [i for b in batches[:2] for i in _chosen(b)]
    assert len(set(first_epoch)) == 4  # drop_last: one pair waits for the next epoch's order
    assert [b.meta["epoch"] for b in batches] == [0, 0, 1, 1, 2] and loader.epoch == 2


def test_a_restored_loader_continues_with_the_next_batch():
    loader = PairLoader(_pairs(7), batch_size=3, seed=1, pad_token_id=0)
    for _ in range(3):
        loader.next_batch()
    state = loader.state_dict()
    resumed = PairLoader(_pairs(7), batch_size=3, seed=1, pad_token_id=0)
    resumed.load_state_dict(state)
    for _ in range(3):
        assert _chosen(resumed.next_batch()) == _chosen(loader.next_batch())


def test_a_position_saved_for_other_pairs_or_seed_is_refused():
    state = PairLoader(_pairs(7), batch_size=3, seed=1, pad_token_id=0).state_dict()
    with pytest.raises(ValueError, match=r"n_rows 7 → 6.*resume with the same pairs"):
        PairLoader(_pairs(6), batch_size=3, seed=1, pad_token_id=0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"seed 1 → 2"):
        PairLoader(_pairs(7), batch_size=3, seed=2, pad_token_id=0).load_state_dict(state)
    with pytest.raises(ValueError, match="1 to 7"):
        PairLoader(_pairs(7), batch_size=8, seed=1, pad_token_id=0)
