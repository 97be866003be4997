"""Rank code for test_spmd: the worker-group interface under torchrun (4 ranks, no Ray)."""

from __future__ import annotations

import torch

from megarl.controller.group import make_colocated_groups, make_worker_group
from megarl.controller.spmd import SPMDWorkerGroup
from megarl.controller.worker import WorkerError
from megarl.distributed.layout import ParallelLayout
from megarl.protocol import Batch
from tests.helpers.workers import EchoWorker, KeepWorldWorker


def main(argv: list[str]) -> dict:
    results: dict = {}
    for name, sizes in {"tp2dp2": {"tp": 2}, "pp2dp2": {"pp": 2}}.items():
        group = SPMDWorkerGroup(None, EchoWorker, "echo", {"layout_kwargs": sizes})
        coords = group.coordinates()
        expected = ParallelLayout(world_size=4, **sizes)
        results[f"{name}_coordinates_ok"] = all(
            (c["tp"], c["pp"], c["dp"]) == (e.tp, e.pp, e.dp)
            for c, e in zip(coords, map(expected.coordinates, range(4)))
        )
        out = group.double(Batch(tensors={"x": torch.arange(10)}))
        results[f"{name}_dp_compute"] = {"y": out["y"].tolist(), "dp_rank": out["dp_rank"].tolist()}

    # no megatron state: dp4, 10 rows padded to 12
    flat = make_worker_group("spmd", None, EchoWorker, "flat", {})
    out = flat.double(Batch(tensors={"x": torch.arange(10)}))
    results["dp4_dp_compute"] = {"y": out["y"].tolist(), "dp_rank": out["dp_rank"].tolist()}
    results["rank_zero"] = flat.rank()
    results["all_to_all"] = flat.take([1, 2, 3, 4])
    results["rank_infos"] = [(i.rank, i.dp_rank, i.dp_size) for i in flat.rank_infos]
    results["role_and_world"] = [flat.role, flat.world_size]

    future = flat.double_async(Batch(tensors={"x": torch.arange(4)}))
    results["async"] = {"done": future.done(), "y": future.result()["y"].tolist()}
    failed = flat.fail_on_async(2)  # the error surfaces at result(), as under Ray
    try:
        failed.result()
        results["async_failure"] = "no error"
    except WorkerError as e:
        results["async_failure"] = str(e).splitlines()[0]

    roles = {"policy": (KeepWorldWorker, {}), "ref": (KeepWorldWorker, {})}
    groups = make_colocated_groups("spmd", None, roles)
    policy, ref = groups["policy"], groups["ref"]
    results["colocated_same_pid"] = [c["pid"] for c in ref.coordinates()] == [
        c["pid"] for c in policy.coordinates()
    ]
    results["colocated_ref_works"] = ref.double(Batch(tensors={"x": torch.arange(4)}))["y"].tolist()

    try:
        flat.fail_on(1)
        results["failure"] = "no error"
    except WorkerError as e:
        results["failure"] = str(e).splitlines()[0]

    gen = make_worker_group("spmd", None, EchoWorker, "gen", {"layout_kwargs": {"tp": 2}, "rollout_tp": 1})
    out = gen.gen_tag(Batch(tensors={"x": torch.arange(10)}))
    results["gen_dp_compute"] = {"x": out["x"].tolist(), "gen_dp_rank": out["gen_dp_rank"].tolist()}

    with policy:  # leaving it shuts down both colocated roles, once each
        pass
    policy.shutdown()
    try:
        ref.rank()
        results["colocated_after_shutdown"] = "no error"
    except WorkerError as e:
        results["colocated_after_shutdown"] = str(e)
    results["colocated_alive"] = [policy.alive, ref.alive]
    results["colocated_shutdowns"] = KeepWorldWorker.shutdowns
    return results
