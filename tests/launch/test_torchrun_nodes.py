"""Bare-metal nodes without a scheduler: `launch/torchrun/node.sh` run once per "node" (two invocations
on this machine, one rank each) trains exactly as one node with the same world size does."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers.launch import CONFIG, REPO, assert_nothing_left, free_port, job_env, run_overrides
from tests.helpers.rl_runs import assert_same_metrics
from tests.helpers.run_files import jsonl_history

pytestmark = pytest.mark.e2e

NODE_SH = REPO / "launch" / "torchrun" / "node.sh"
TIMEOUT_S = 400
ENGINE_METRICS = ("train_rollout_logprob_abs_diff", "train_rollout_logprob_abs_diff_max")


def start_node(tiny_run: dict, out, nnodes: int, node_rank: int, nproc: int, port: int) -> subprocess.Popen:
    # the "nodes" share this machine's cores, so 1 thread per rank in both runs (torchrun sets it only
    # for --nproc_per_node > 1); OpenBLAS GEMMs' last bits also depend on it (models/cpu_gemm.py)
    env = {
        **os.environ,
        **job_env(OMP_NUM_THREADS="1"),
        "NNODES": str(nnodes),
        "NODE_RANK": str(node_rank),
        "NPROC_PER_NODE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    cmd = ["bash", str(NODE_SH), str(CONFIG), *run_overrides(tiny_run, out)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(procs: list[subprocess.Popen]) -> list[str]:
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log[-4000:]
    return logs


def test_two_nodes_train_like_one_node_of_the_same_world_size(tiny_run, tmp_path):
    two, one = tmp_path / "two_nodes", tmp_path / "one_node"
    port = free_port()
    finish([start_node(tiny_run, two, 2, rank, 1, port) for rank in (0, 1)])
    finish([start_node(tiny_run, one, 1, 0, 2, free_port())])

    expected, actual = jsonl_history(one), jsonl_history(two)
    assert sorted(actual) == sorted(expected) == [1, 2]
    for step in (1, 2):
        # the trainer's metrics exactly; the engine-vs-trainer log-prob gap to 1e-6: a CI machine's vLLM
        # was not bitwise the same for 2 ranks on one node and 1 rank on each of 2 (the entropy, from the
        # trainer's forward, was), which this machine never reproduced
        engine = {k: v for k, v in expected[step].items() if k.startswith(ENGINE_METRICS)}
        trainer = {k: v for k, v in expected[step].items() if k not in engine}
        compared = assert_same_metrics(trainer, actual[step])
        assert len(compared) > 20 and "actor/pg_loss" in compared and "actor/entropy" in compared
        assert sorted(assert_same_metrics(engine, actual[step], abs_=1e-6)) == sorted(ENGINE_METRICS)
    for out in (one, two):
        assert_nothing_left(str(out))
