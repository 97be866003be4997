"""PromptSampler / PromptLoader: a fixed order per (seed, epoch), drop_last batches, exact resume."""

from __future__ import annotations

import pytest

from megarl.config.schema import DataConfig
from megarl.data.datasets import DataError, PromptDataset
from megarl.data.loader import PromptLoader
from megarl.data.sampler import PromptSampler
from tests.helpers.data import write_jsonl

pytestmark = pytest.mark.unit


def take(sampler, k):
    return [sampler.next_indices() for _ in range(k)]


def test_each_epoch_is_a_permutation_fixed_by_seed_and_epoch():
    a, b = PromptSampler(10, 3, seed=1), PromptSampler(10, 3, seed=1)
    batches = take(a, 6)
    assert batches == take(b, 6)
    first, second = batches[:3], batches[3:]
    assert a.steps_per_epoch == 3 and a.epoch == 1
    for epoch in (first, second):
        rows = [i for batch in epoch for i in batch]
        assert len(set(rows)) == 9 and all(len(batch) == 3 for batch in epoch)  # drop_last: one row waits
    assert first != second
    assert take(PromptSampler(10, 3, seed=2), 3) != first


def test_no_shuffle_is_file_order():
    assert take(PromptSampler(5, 2, seed=0, shuffle=False), 3) == [[0, 1], [2, 3], [0, 1]]


def test_resume_mid_epoch_continues_the_same_batches():
    run = PromptSampler(10, 3, seed=7)
    take(run, 2)
    state = run.state_dict()
    assert state == {"epoch": 0, "position": 6, "seed": 7, "n_rows": 10}
    expected = take(run, 4)
    resumed = PromptSampler(10, 3, seed=7)
    resumed.load_state_dict(state)
    assert take(resumed, 4) == expected


def test_resume_with_another_seed_is_refused():
    sampler = PromptSampler(10, 3, seed=7)
    with pytest.raises(ValueError, match="resume with the same data.seed"):
        sampler.load_state_dict({"epoch": 0, "position": 3, "seed": 8})


def test_fewer_prompts_than_a_batch_is_a_data_error():
    with pytest.raises(DataError) as info:
        PromptSampler(3, 4, seed=0)
    assert str(info.value) == (
        "the dataset has 3 usable prompts, fewer than data.train_batch_size=4; lower data.train_batch_size "
        "to at most 3 or add prompts"
    )


def test_loader_batches_epochs_and_resumes(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", [{"data_source": "x", "prompt": f"{i} + 1 ="} for i in range(5)])
    cfg = DataConfig(train_files=[path], train_batch_size=2, seed=3)
    loader = PromptLoader.from_config(cfg, PromptDataset.from_config(cfg, tokenizer))
    epoch0 = [b["index"].tolist() for b in loader]
    assert len(epoch0) == loader.steps_per_epoch == 2
    batch = loader.next_batch()
    assert batch.meta == {"epoch": 1} and len(batch) == 2
    state = loader.state_dict()
    following = loader.next_batch()["index"].tolist()
    again = PromptLoader.from_config(cfg, loader.dataset)
    again.load_state_dict(state)
    assert again.next_batch()["index"].tolist() == following


def test_resume_into_another_training_set_is_refused():
    state = PromptSampler(10, 3, seed=7).state_dict()
    with pytest.raises(ValueError, match="a training set of 10 prompts, this run's has 12"):
        PromptSampler(12, 3, seed=7).load_state_dict(state)
