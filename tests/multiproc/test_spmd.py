"""The worker-group interface under torchrun (SPMD backend): the same checks as the Ray tests. Its rank
program runs in the 4-rank launch shared with other modules (tests/multiproc/conftest.py)."""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

SHARED_PART = ("spmd", "tests.multiproc.spmd_checks", lambda request: [])


@pytest.fixture(scope="module")
def spmd(shared_launch):
    return shared_result(shared_launch, "spmd")


@pytest.mark.parametrize("layout", ["tp2dp2", "pp2dp2"])
def test_ranks_report_their_layout_coordinates(spmd, layout):
    assert spmd[f"{layout}_coordinates_ok"]


@pytest.mark.parametrize("layout", ["tp2dp2", "pp2dp2"])
def test_dp_compute_splits_by_replica_and_collects_in_order(spmd, layout):
    out = spmd[f"{layout}_dp_compute"]
    assert out["y"] == [2 * i for i in range(10)]
    assert out["dp_rank"] == [0] * 5 + [1] * 5


def test_dp_compute_pads_uneven_batches_and_drops_the_padding(spmd):
    out = spmd["dp4_dp_compute"]
    assert out["y"] == [2 * i for i in range(10)]
    assert out["dp_rank"] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


def test_rank_zero_and_all_to_all(spmd):
    assert spmd["rank_zero"] == 0
    assert spmd["all_to_all"] == [10, 21, 32, 43]


def test_rank_infos_role_and_world_size(spmd):
    assert spmd["rank_infos"] == [[r, r, 4] for r in range(4)]
    assert spmd["role_and_world"] == ["flat", 4]


def test_async_call_returns_a_completed_future(spmd):
    assert spmd["async"] == {"done": True, "y": [0, 2, 4, 6]}
    assert "flat.fail_on failed on 1 rank(s); first: rank 2" in spmd["async_failure"]


def test_colocated_roles_share_the_process(spmd):
    assert spmd["colocated_same_pid"]
    assert spmd["colocated_ref_works"] == [0, 2, 4, 6]


def test_shutting_down_one_colocated_group_ends_both(spmd):
    assert spmd["colocated_after_shutdown"] == "ref group is shut down"
    assert spmd["colocated_alive"] == [False, False]
    assert spmd["colocated_shutdowns"] == 2


def test_a_failing_rank_raises_on_every_rank_naming_it(spmd):
    assert (
        "echo" not in spmd["failure"] and "flat.fail_on failed on 1 rank(s); first: rank 1" in spmd["failure"]
    )


def test_gen_dp_compute_treats_micro_dp_replicas_as_data_parallel_ranks(spmd):
    # training tp2 x dp2, rollout tp1: 4 generation replicas; 10 rows padded to 12, 3 per replica
    out = spmd["gen_dp_compute"]
    assert out["x"] == list(range(10))
    assert out["gen_dp_rank"] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
