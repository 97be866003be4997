"""A real SLURM (munged, slurmctld, two slurmd on this machine) for the session, and a tiny RL run's
model, data and config overrides for the launch scripts to run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.slurm import SlurmCluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory) -> Iterator[SlurmCluster]:
    cluster = SlurmCluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> dict[str, Path]:
    from megarl.data.tasks import make_task
    from megarl.models.tiny import build_tiny_hf

    root = tmp_path_factory.mktemp("slurm_run")
    model = build_tiny_hf(root / "llama", family="llama")
    make_task("digits_reverse", root / "data", n_train=64, n_val=8, n_sft=8, n_pref=8)
    return {"model": model, "data": root / "data", "root": root}
