"""Rank code for test_spmd: the worker-group interface under torchrun (4 ranks, no Ray)."""

from __future__ import annotations

import torch

from megarl.controller.spmd import SPMDWorkerGroup
from megarl.controller.worker import WorkerError
from megarl.distributed.layout import ParallelLayout
from megarl.protocol import Batch
from tests.helpers.workers import EchoWorker


def main(argv: list[str]) -> dict:
    results: dict = {}
    for name, sizes in {"tp2dp2": {"tp": 2}, "pp2dp2": {"pp": 2}}.items():
        group = SPMDWorkerGroup(EchoWorker, "echo", {"layout_kwargs": sizes})
        coords = group.coordinates()
        expected = ParallelLayout(world_size=4, **sizes)
        results[f"{name}_coordinates_ok"] = all(
            (c["tp"], c["pp"], c["dp"]) == (e.tp, e.pp, e.dp)
            for c, e in zip(coords, map(expected.coordinates, range(4)))
        )
        out = group.double(Batch(tensors={"x": torch.arange(10)}))
        results[f"{name}_dp_compute"] = {"y": out["y"].tolist(), "dp_rank": out["dp_rank"].tolist()}

    flat = SPMDWorkerGroup(EchoWorker, "flat", {})  # no megatron state: dp4, 10 rows padded to 12
    out = flat.double(Batch(tensors={"x": torch.arange(10)}))
    results["dp4_dp_compute"] = {"y": out["y"].tolist(), "dp_rank": out["dp_rank"].tolist()}
    results["rank_zero"] = flat.rank()
    results["all_to_all"] = flat.take([1, 2, 3, 4])

    ref = SPMDWorkerGroup(EchoWorker, "ref", {})
    results["colocated_same_pid"] = [c["pid"] for c in ref.coordinates()] == [
        c["pid"] for c in flat.coordinates()
    ]
    results["colocated_ref_works"] = ref.double(Batch(tensors={"x": torch.arange(4)}))["y"].tolist()

    try:
        flat.fail_on(1)
        results["failure"] = "no error"
    except WorkerError as e:
        results["failure"] = str(e).splitlines()[0]

    gen = SPMDWorkerGroup(EchoWorker, "gen", {"layout_kwargs": {"tp": 2}, "rollout_tp": 1})
    out = gen.gen_tag(Batch(tensors={"x": torch.arange(10)}))
    results["gen_dp_compute"] = {"x": out["x"].tolist(), "gen_dp_rank": out["gen_dp_rank"].tolist()}

    return results
