"""RayWorkerGroup on a local Ray cluster: layouts, dispatch, colocation, failures and hangs."""

from __future__ import annotations

import time

import psutil
import pytest
import torch

from megarl.controller.group import WorkerGroup, make_colocated_groups, make_worker_group
from megarl.controller.resource_pool import ResourcePool, ResourcePoolError
from megarl.controller.worker import WorkerError
from megarl.controller.worker_group import RayWorkerGroup
from megarl.distributed.layout import ParallelLayout
from megarl.protocol import Batch
from tests.helpers.launch import RAY_PROCESS_NAMES, non_loopback_listeners
from tests.ray.workers import FailsToStart, PolicyRole, ProbeWorker, RefRole

pytestmark = pytest.mark.ray


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_gone(pids: list[int], timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _alive(pids)


@pytest.fixture(scope="module")
def tp2_dp2(pool4):
    group = make_worker_group("ray", pool4, ProbeWorker, "policy", {"layout_kwargs": {"tp": 2}})
    yield group
    group.shutdown()


def _check_coordinates(group: WorkerGroup, layout: ParallelLayout) -> None:
    reported = group.coordinates()
    assert [c["rank"] for c in reported] == list(range(4))
    for c in reported:
        expected = layout.coordinates(c["rank"])
        assert (c["tp"], c["pp"], c["dp"], c["cp"]) == (expected.tp, expected.pp, expected.dp, expected.cp)
    assert len({c["pid"] for c in reported}) == 4
    assert [c["pid"] for c in reported] == [p["pid"] for p in group.processes]


def test_tp2_dp2_ranks_report_layout_coordinates(tp2_dp2):
    _check_coordinates(tp2_dp2, ParallelLayout(world_size=4, tp=2))
    assert isinstance(tp2_dp2, RayWorkerGroup)
    assert tp2_dp2.world_size == 4 and tp2_dp2.role == "policy"
    assert [(i.rank, i.dp_rank, i.dp_size, i.collect) for i in tp2_dp2.rank_infos] == [
        (0, 0, 2, True),
        (1, 0, 2, False),
        (2, 1, 2, True),
        (3, 1, 2, False),
    ]
    assert tp2_dp2.world_sum([1, 2, 3, 4]) == [10] * 4


@pytest.mark.parametrize("rows", [10, 9])
def test_dp_compute_splits_by_dp_rank_and_drops_padding(tp2_dp2, rows):
    out = tp2_dp2.double(Batch(tensors={"x": torch.arange(rows)}))
    assert len(out) == rows
    assert torch.equal(out.tensors["y"], torch.arange(rows) * 2)
    half = (rows + 1) // 2
    assert out.tensors["dp_rank"].tolist() == [0] * half + [1] * (rows - half)
    assert out.tensors["rank"].tolist() == [0] * half + [2] * (rows - half)  # TP rank 0 collects


def test_async_calls_overlap_and_collect(tp2_dp2):
    futures = [tp2_dp2.sleep_on_async(r, 1.0) for r in range(4)]
    assert not futures[-1].done()
    assert [f.result() for f in futures] == [[0, 1, 2, 3]] * 4
    assert all(f.done() for f in futures)


def test_pp2_dp2_colocated_roles_share_one_process_and_world(pool4):
    layout = {"layout_kwargs": {"pp": 2}}
    groups = make_colocated_groups("ray", pool4, {"policy": (PolicyRole, layout), "ref": (RefRole, layout)})
    try:
        _check_coordinates(groups["ref"], ParallelLayout(world_size=4, pp=2))
        policy, ref = groups["policy"].whoami(), groups["ref"].whoami()
        assert [p["pid"] for p in policy] == [r["pid"] for r in ref]
        assert [p["world"] for p in policy] == [r["world"] for r in ref]
        assert groups["ref"].world_size_seen() == 4
        out = groups["policy"].double(Batch(tensors={"x": torch.arange(10)}))
        assert torch.equal(out.tensors["y"], torch.arange(10) * 2)
        assert out.tensors["rank"].tolist() == [2] * 5 + [3] * 5  # the last PP stage collects
    finally:
        with groups["policy"]:  # leaving the context shuts the shared processes down
            pass
    assert not groups["ref"].alive
    assert _wait_gone([p["pid"] for p in policy]) == []


def test_rank_raising_mid_collective_raises_worker_error_and_kills_all(pool2):
    group = RayWorkerGroup(pool2, ProbeWorker, "actor")
    pids = [p["pid"] for p in group.processes]
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"actor\.fail_in_collective failed on rank 1 of 2") as err:
        group.fail_in_collective(1)
    assert time.monotonic() - start < 30
    assert err.value.rank == 1 and err.value.pid == pids[1]
    assert "injected failure on rank 1" in str(err.value) and "Traceback" in str(err.value)
    assert _wait_gone(pids) == []
    with pytest.raises(WorkerError, match="shut down"):
        group.coordinates()


def test_killed_rank_raises_worker_error_naming_it_and_its_log_and_no_actor_survives(
    pool2, monkeypatch, tmp_path
):
    monkeypatch.setenv("MEGARL_FAULT", "kill@actor.world_sum#2/1")  # forwarded into the actors' env
    group = RayWorkerGroup(pool2, ProbeWorker, "actor", log_dir=tmp_path)
    procs = group.processes
    assert group.world_sum([1, 2]) == [3, 3]  # the 1st call is not the target
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"actor\.world_sum failed on rank 1 of 2 on ") as err:
        group.world_sum([1, 2])
    seconds = time.monotonic() - start
    assert seconds < 30, seconds
    assert (err.value.role, err.value.rank, err.value.pid) == ("actor", 1, procs[1]["pid"])
    assert err.value.host == procs[1]["host"] and procs[1]["host"] in str(err.value)
    pids = [p["pid"] for p in procs]
    assert f"all actors of the group were killed (pids {pids[0]}, {pids[1]} gone)" in str(err.value) or (
        f"(pids {pids[1]}, {pids[0]} gone)" in str(err.value)
    )
    assert _alive(pids) == []  # the message says so only once they are gone
    log = tmp_path / "actor_rank1.log"  # the rank's own stderr: the fault says where it struck
    assert f"output: {log}" in str(err.value)
    assert "megarl: injected fault kill at actor.world_sum" in log.read_text()
    assert (tmp_path / "actor_rank0.log").exists()


def test_hanging_rank_times_out_with_worker_error(pool2):
    group = RayWorkerGroup(pool2, ProbeWorker, "reward", call_timeout_s=2)
    pids = [p["pid"] for p in group.processes]
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank\(s\) 1 \(.*\) did not answer within 2s") as err:
        group.sleep_on(1, 120)
    assert time.monotonic() - start < 10
    assert err.value.rank == 1
    assert _wait_gone(pids) == []


def test_pool_orders_bundles_and_limits_colocation(ray_cluster):
    pool = ResourcePool([2, 1], use_gpu=False, cpus_per_rank=0.25, name="test-pool21", max_colocate=1)
    try:
        assert pool.world_size == 3
        assert [p.local_rank for p in pool.placements()] == [0, 1, 2]  # one node here: ranks count on
        a, b, c = pool.placements()
        assert [p.bundle_index for p in (a, b, c)] == [0, 1, 0]
        assert a.placement_group == b.placement_group != c.placement_group
        pool.attach()
        with pytest.raises(ResourcePoolError, match="max_colocate=1"):
            pool.attach()
    finally:
        pool.remove()


def test_worker_failing_to_start_raises_worker_error(pool2):
    with pytest.raises(WorkerError, match=r"critic\.__init__ failed on rank \d of 2") as err:
        RayWorkerGroup(pool2, FailsToStart, "critic")
    assert "no checkpoint at /nonexistent" in str(err.value)


def test_the_session_cluster_is_named_and_listens_on_loopback_only(pool2, tp2_dp2):
    """megarl's own cluster (start_local_ray): every Ray process of it listens on 127.0.0.1 alone (no
    dashboard, agent, metrics exporter or GCS port on another interface), megarl's rank processes too:
    rank 0 of a worker group serves torch.distributed's store at MASTER_PORT on 127.0.0.1 only (torch
    itself would bind every interface); RAY_ADDRESS names the cluster for the `megarl` commands the tests
    start."""
    import os

    from megarl.controller.resource_pool import cluster_address

    assert os.environ["RAY_ADDRESS"] == cluster_address() and cluster_address().startswith("127.0.0.1:")
    ray_pids = []
    for child in psutil.Process().children(recursive=True):
        try:
            text = f"{child.name()} {' '.join(child.cmdline())}"
        except psutil.Error:
            continue
        if any(name in text for name in RAY_PROCESS_NAMES):
            ray_pids.append(child.pid)
    rank_pids = [p["pid"] for p in tp2_dp2.processes]
    assert len(ray_pids) >= 3 and set(rank_pids) <= set(ray_pids)  # gcs_server, raylet, agents, workers
    assert non_loopback_listeners(ray_pids) == []
    rank0 = psutil.Process(rank_pids[0])
    store_port = int(rank0.environ()["MASTER_PORT"])
    listening = [c.laddr for c in rank0.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    assert [a.ip for a in listening if a.port == store_port] == ["127.0.0.1"], listening
