"""Which prompts each training step gets: a deterministic order per (seed, epoch), resumable mid-epoch.

`PromptSampler(n_rows, batch_size, seed)` yields lists of `batch_size` row indices (drop_last: the rows
that do not fill a last batch wait for the next epoch's order). Epoch e's order is a permutation drawn
from numpy's PCG64 seeded with (seed, e) — the same on every machine and rank — or file order when
`shuffle=False`. `state_dict()` = {epoch, position, seed}; a sampler given it with `load_state_dict`
continues with exactly the batch the saved one would have produced next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from megarl.data.files import DataError


class PromptSampler:
    """Batches of row indices over epochs; see the module doc."""

    def __init__(self, n_rows: int, batch_size: int, seed: int, shuffle: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if n_rows < batch_size:
            raise DataError(
                f"the dataset has {n_rows} usable prompts, fewer than data.train_batch_size={batch_size}; "
                f"lower data.train_batch_size to at most {n_rows} or add prompts"
            )
        self.n_rows, self.batch_size, self.seed, self.shuffle = n_rows, batch_size, seed, shuffle
        self.epoch = 0
        self.position = 0  # rows of the current epoch's order already handed out

    @property
    def steps_per_epoch(self) -> int:
        return self.n_rows // self.batch_size

    def order(self, epoch: int) -> np.ndarray:
        """Row indices of `epoch` in the order they are handed out."""
        if not self.shuffle:
            return np.arange(self.n_rows)
        return np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.n_rows)

    def next_indices(self) -> list[int]:
        """The next batch; moves to the next epoch when the current one has no full batch left."""
        if self.position + self.batch_size > self.n_rows:
            self.epoch, self.position = self.epoch + 1, 0
        start = self.position
        self.position += self.batch_size
        return self.order(self.epoch)[start : self.position].tolist()

    def epoch_indices(self) -> Iterator[list[int]]:
        """The batches left in the current epoch (all of them at its start, or of the next epoch when the
        current one has no full batch left)."""
        if self.position + self.batch_size > self.n_rows:
            self.epoch, self.position = self.epoch + 1, 0
        while self.position + self.batch_size <= self.n_rows:
            yield self.next_indices()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "n_rows": self.n_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["seed"] != self.seed:
            raise ValueError(
                f"the saved data order used data.seed={state['seed']} but this run has data.seed={self.seed}; "
                "resume with the same data.seed to continue the same order"
            )
        if state.get("n_rows", self.n_rows) != self.n_rows:
            raise ValueError(
                f"the saved data position is in a training set of {state['n_rows']} prompts, this run's has "
                f"{self.n_rows}; resume with the same data.train_files (and data.max_prompt_length), or start "
                "afresh with trainer.resume=disable"
            )
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
