"""The training loaders of an RL run, in `PromptSampler` order (by (seed, epoch)), resumable.

`PromptLoader`: prompt Batches from a `PromptDataset`.

loader = PromptLoader.from_config(cfg.data, PromptDataset.from_config(cfg.data, tokenizer))
batch = loader.next_batch()          # data.train_batch_size prompts; meta {"epoch": e}
state = loader.state_dict()          # {epoch, position, seed}: save it with the checkpoint
loader.load_state_dict(state)        # a resumed run continues with the very next batch

`PairLoader`: preference pair Batches (chosen and rejected rows interleaved, `pair_batch`) for a
preference update inside the RL step (megarl.trainer.preference_stage), cycling over epochs the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from megarl.config.schema import DataConfig
from megarl.data.datasets import PromptDataset
from megarl.data.preference import PreferencePair, pair_batch
from megarl.data.sampler import PromptSampler
from megarl.protocol import Batch


class PromptLoader:
    """Batches of `batch_size` prompts, shuffled by (seed, epoch), over as many epochs as asked for."""

    def __init__(self, dataset: PromptDataset, batch_size: int, seed: int, shuffle: bool = True) -> None:
        self.dataset = dataset
        self.sampler = PromptSampler(len(dataset), batch_size, seed, shuffle)

    @classmethod
    def from_config(cls, data: DataConfig, dataset: PromptDataset) -> PromptLoader:
        return cls(dataset, data.train_batch_size, data.seed, data.shuffle)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    def next_batch(self) -> Batch:
        """The next training batch, crossing into the next epoch when the current one is used up."""
        indices = self.sampler.next_indices()
        return self._batch(indices)

    def __iter__(self) -> Iterator[Batch]:
        """The batches left in the current epoch."""
        for indices in self.sampler.epoch_indices():
            yield self._batch(indices)

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)

    def _batch(self, indices: list[int]) -> Batch:
        batch = self.dataset.batch(indices)
        batch.meta["epoch"] = self.sampler.epoch
        return batch


class PairLoader:
    """Batches of `batch_size` preference pairs (2·batch_size rows: chosen, rejected, …), shuffled by
    (seed, epoch), over as many epochs as asked for (the pairs that do not fill a last batch wait for
    the next epoch's order)."""

    def __init__(self, pairs: list[PreferencePair], batch_size: int, seed: int, pad_token_id: int) -> None:
        if not 1 <= batch_size <= len(pairs):
            raise ValueError(f"a batch of {batch_size} pairs needs 1 to {len(pairs)} (the usable pairs)")
        self.pairs, self.pad_token_id = pairs, pad_token_id
        self.sampler = PromptSampler(len(pairs), batch_size, seed)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    def next_batch(self) -> Batch:
        """The next pairs as a Batch (`pair_batch`); meta {"epoch": e}."""
        indices = self.sampler.next_indices()
        batch = pair_batch([self.pairs[i] for i in indices], self.pad_token_id)
        batch.meta["epoch"] = self.sampler.epoch
        return batch

    def state_dict(self) -> dict[str, Any]:
        """{epoch, position, seed, n_rows}: the pairs handed out so far (JSON, for the checkpoint)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue with the batch the saved loader would have given next (same pairs and seed only)."""
        ours = self.sampler.state_dict()
        changed = [f"{k} {state.get(k)} → {ours[k]}" for k in ("seed", "n_rows") if state.get(k) != ours[k]]
        if changed:
            raise ValueError(
                f"the saved position in the preference pairs does not fit these pairs ({', '.join(changed)}: "
                "data.seed, the usable pairs of the files); resume with the same pairs and data.seed, or start "
                "afresh with trainer.resume=disable"
            )
        self.sampler.load_state_dict(state)
