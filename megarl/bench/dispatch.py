"""`megarl bench dispatch`: driver -> worker group -> driver round trip of a Batch, Ray vs SPMD.

Each backend runs a 2-rank group (DP=2) whose DP_COMPUTE method returns its slice unchanged, so the
time is dispatch + transport + collect. Ray: the driver sends the batch to the actors and gathers the
slices. SPMD (torchrun): every rank holds the batch, keeps its slice, and all-gathers the results.
Writes one JSON file with the median seconds per size and the Ray/SPMD ratio.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.protocol import Batch

SIZES_MIB = (1, 64)


class EchoBenchWorker(Worker):
    @register(Dispatch.DP_COMPUTE)
    def identity(self, batch: Batch) -> Batch:
        return batch


def make_batch(mib: int) -> Batch:
    """The same batch on every rank (SPMD drivers must agree on their inputs)."""
    rows = 64
    generator = torch.Generator().manual_seed(mib)
    return Batch(tensors={"x": torch.randn(rows, mib * 2**20 // 4 // rows, generator=generator)})


def time_round_trips(call, repeats: int) -> dict[str, float]:
    out = {}
    for mib in SIZES_MIB:
        batch = make_batch(mib)
        for _ in range(2):
            call(batch)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            result = call(batch)
            samples.append(time.perf_counter() - start)
        assert torch.equal(result["x"], batch["x"])
        out[f"{mib}MiB"] = statistics.median(samples)
    return out


def bench_ray(repeats: int) -> dict[str, float]:
    from megarl.controller.group import make_worker_group
    from megarl.controller.resource_pool import ResourcePool, start_local_ray

    start_local_ray()
    with ResourcePool([2], use_gpu=False, name="bench-dispatch") as pool:
        with make_worker_group("ray", pool, EchoBenchWorker, "bench") as group:
            return time_round_trips(group.identity, repeats)


def bench_spmd_rank(spec: dict) -> dict:
    """The rank program of the SPMD half (megarl.distributed.rank_program)."""
    from megarl.controller.group import make_worker_group

    group = make_worker_group("spmd", None, EchoBenchWorker, "bench")
    result = time_round_trips(group.identity, spec["repeats"])
    group.shutdown()
    return result


def run(out: Path, repeats: int = 5) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    spmd = launch_rank_program("megarl.bench.dispatch:bench_spmd_rank", {"repeats": repeats}, nproc=2)
    if not spmd.results:
        raise RuntimeError(f"SPMD benchmark failed:\n{spmd.failure_summary()}")
    result = {
        "what": "median seconds of one driver->group->driver round trip, 2 ranks (DP=2), CPU",
        "spmd": spmd.results[0],
        "ray": bench_ray(repeats),
    }
    result["ray_over_spmd"] = {k: result["ray"][k] / result["spmd"][k] for k in result["ray"]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result
