"""`megarl bench dispatch`: driver -> worker group -> driver round trip of a Batch, Ray vs SPMD.

Each backend runs a 2-rank group (DP=2) whose DP_COMPUTE method returns its slice unchanged, so the
time is dispatch + transport + collect. Ray: the driver sends the batch to the actors and gathers the
slices. SPMD (torchrun): every rank holds the batch, keeps its slice, and all-gathers the results.
Writes one JSON file with the median seconds per size and the Ray/SPMD ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def bench_spmd_rank(repeats: int) -> None:
    """Rank code under torchrun."""
    import torch.distributed as dist

    from megarl.controller.group import make_worker_group
    from megarl.distributed.launch import report

    group = make_worker_group("spmd", None, EchoBenchWorker, "bench")
    result = time_round_trips(group.identity, repeats)
    if dist.get_rank() == 0:
        report(result)
    group.shutdown()


def run(out: Path, repeats: int = 5) -> dict:
    from megarl.distributed.launch import run_torchrun

    spmd = run_torchrun("megarl.bench.dispatch", ["--spmd-rank", "--repeats", str(repeats)], nproc=2)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="outputs/bench/dispatch.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spmd-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.spmd_rank:
        bench_spmd_rank(args.repeats)
    else:
        print(json.dumps(run(Path(args.out), args.repeats), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
