"""`PromptLoader`: training prompt Batches from a `PromptDataset` in `PromptSampler` order, resumable.

loader = PromptLoader.from_config(cfg.data, PromptDataset.from_config(cfg.data, tokenizer))
batch = loader.next_batch()          # data.train_batch_size prompts; meta {"epoch": e}
state = loader.state_dict()          # {epoch, position, seed}: save it with the checkpoint
loader.load_state_dict(state)        # a resumed run continues with the very next batch
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from megarl.config.schema import DataConfig
from megarl.data.datasets import PromptDataset
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
