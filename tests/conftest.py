"""Shared fixtures: tiny HF models built once per session, and a torchrun launcher."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from megarl.distributed.rank_program import LaunchResult, launch_rank_program
from megarl.rollout.engine_cache import ENV as ENGINE_CACHE

# One engine cache for the session and the processes its tests start (megarl.rollout.engine_cache): the
# first compiled engine of a model config compiles, every later one loads that. Outside the user's home;
# kept between sessions like Inductor's own /tmp cache (its keys make a stale entry miss, never load).
os.environ.setdefault(ENGINE_CACHE, str(Path(tempfile.gettempdir()) / "megarl-test-engine-cache"))

# Larger-than-default init so logits are O(1-10): conversion mistakes then show up far above tolerance.
PARITY_INIT = {"initializer_range": 0.1}
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny Llama (untied), Mistral, Qwen2 (q/k/v bias, tied embeddings) and Qwen3 (q/k norms); vocab 1001
    (not divisible by TP), head_dim 32, GQA (4 query heads, 2 kv heads), 4 layers."""
    from megarl.models.tiny import build_tiny_hf

    root = tmp_path_factory.mktemp("tiny_models")
    return {family: build_tiny_hf(root / family, family=family, **PARITY_INIT) for family in FAMILIES}


@pytest.fixture(scope="session")
def tiny_reward_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny Llama and Qwen2 reward models (*ForSequenceClassification, one label: `score.weight`)."""
    from megarl.models.tiny import build_tiny_hf

    root = tmp_path_factory.mktemp("tiny_reward_models")
    return {f: build_tiny_hf(root / f, family=f, scalar_head=True, **PARITY_INIT) for f in ("llama", "qwen2")}


@pytest.fixture(scope="session")
def torchrun():
    """torchrun(program, args, nproc) -> LaunchResult of the rank program "module[:function]" (see
    megarl.distributed.rank_program); fails the test with the ranks' errors if it crashed."""

    def launch(
        program: str, args: list[str], nproc: int, timeout: float = 240, check: bool = True
    ) -> LaunchResult:
        result = launch_rank_program(program, [str(a) for a in args], nproc, timeout=timeout)
        if check and result.returncode != 0:
            pytest.fail(f"{program} exited {result.returncode}:\n{result.failure_summary()}")
        return result

    return launch


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One loopback Ray cluster for the whole session (starting Ray costs 3-5 s and ~0.5 GB). 8 CPU
    slots: 4 ranks x 0.5 CPU, colocated groups and the driver fit. RAY_ADDRESS names it, so that the
    `megarl` commands the tests start join it instead of starting their own."""
    import os

    import ray

    from megarl.controller.resource_pool import cluster_address, start_local_ray

    named = os.environ.get("RAY_ADDRESS")
    start_local_ray(num_cpus=8)
    os.environ["RAY_ADDRESS"] = cluster_address()
    yield
    ray.shutdown()
    if named is None:
        os.environ.pop("RAY_ADDRESS", None)
    else:
        os.environ["RAY_ADDRESS"] = named
