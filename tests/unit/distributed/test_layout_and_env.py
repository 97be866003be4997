"""ParallelLayout coordinates and validation; rank discovery from torchrun, SLURM and arguments."""

import pytest

from megarl.distributed.env import _first_slurm_host, detect_env
from megarl.distributed.layout import Coordinates, LayoutError, ParallelLayout

pytestmark = pytest.mark.unit


def test_tp_ranks_are_consecutive_and_pp_is_outermost():
    layout = ParallelLayout(world_size=8, tp=2, pp=2)
    assert layout.dp == 2
    assert layout.tp_group_ranks(5) == [4, 5]
    assert layout.dp_group_ranks(1) == [1, 3]
    assert layout.pp_group_ranks(1) == [1, 5]
    assert layout.coordinates(7) == Coordinates(tp=1, cp=0, dp=1, pp=1)
    assert all(layout.rank(layout.coordinates(r)) == r for r in range(8))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"world_size": 6, "tp": 4},
            "tp·pp·cp = 4·1·1 = 4 does not divide world_size=6; make tp·pp·cp one of 1, 2, 3, 6",
        ),
        ({"world_size": 4, "tp": 0}, "tp=0 must be ≥ 1; use 1 to turn it off"),
        ({"world_size": 4, "vpp": 2}, "vpp=2 needs pp > 1; set vpp=null or raise pp"),
        (
            {"world_size": 4, "sequence_parallel": True},
            "sequence_parallel=true needs tp > 1; set sequence_parallel=false",
        ),
        ({"world_size": 4, "tp": 2, "ep": 2}, "ep=2 with tp=2 needs sequence_parallel=true"),
        ({"world_size": 6, "ep": 4}, "tp·pp·ep = 1·1·4 = 4 does not divide world_size=6"),
        ({"world_size": 0}, "world_size=0 must be ≥ 1"),
    ],
)
def test_impossible_layouts_say_how_to_fix(kwargs, message):
    with pytest.raises(LayoutError, match=message):
        ParallelLayout(**kwargs)


def test_describe_names_every_size():
    assert (
        ParallelLayout(world_size=8, tp=2, pp=2, vpp=2, sequence_parallel=True).describe()
        == "tp2xpp2xdp2xvpp2xsp"
    )


def test_env_prefers_explicit_then_torchrun_then_slurm(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    slurm = detect_env()
    assert (slurm.rank, slurm.world_size, slurm.local_rank, slurm.master_addr, slurm.source) == (
        3,
        8,
        1,
        "gpu07",
        "slurm",
    )
    assert slurm.master_port == 21234
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert detect_env().source == "torchrun"
    assert detect_env(rank=0, world_size=1).source == "explicit"


@pytest.mark.parametrize(
    "nodelist, first",
    [("node1", "node1"), ("gpu[03-05,07]", "gpu03"), ("a[1,3],b2", "a1"), ("x-[10-11]", "x-10")],
)
def test_first_slurm_host(nodelist, first):
    assert _first_slurm_host(nodelist) == first
