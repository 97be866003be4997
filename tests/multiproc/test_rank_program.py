"""The rank-program harness under torchrun: rank 0's results come back, `"passed": false` fails the run,
and a rank that raises reports its own error and rank."""

import pytest

from megarl.distributed.rank_program import launch_rank_program

pytestmark = pytest.mark.multiproc

HERE = "tests.multiproc.test_rank_program"


def world(spec: dict) -> list[dict]:
    import torch.distributed as dist

    return [{"rank": dist.get_rank(), "world": dist.get_world_size(), "spec": spec}, {"passed": False}]


def fail_on(spec: dict) -> dict:
    import torch.distributed as dist

    if dist.get_rank() == spec["rank"]:
        raise ValueError(f"rank {spec['rank']} was told to fail")
    return {}


def test_rank_zero_results_come_back_and_a_failed_result_fails_the_run():
    launch = launch_rank_program(f"{HERE}:world", {"x": [1, 2]}, nproc=2, timeout=120)
    assert launch.results == [{"rank": 0, "world": 2, "spec": {"x": [1, 2]}}, {"passed": False}]
    assert launch.returncode == 1 and launch.errors == []


def test_an_exception_comes_back_with_the_rank_that_raised_it():
    launch = launch_rank_program(f"{HERE}:fail_on", {"rank": 1}, nproc=2, timeout=120)
    assert launch.returncode != 0
    assert [(e["rank"], e["error"]) for e in launch.errors] == [(1, "ValueError: rank 1 was told to fail")]
    assert "in fail_on" in launch.errors[0]["traceback"]
    assert launch.failure_summary().endswith("[rank 1] ValueError: rank 1 was told to fail")
