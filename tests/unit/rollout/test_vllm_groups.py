"""Generation TP groups handed to vLLM: validation, vLLM's default grouping, and the version pin."""

from __future__ import annotations

import os
import subprocess

import pytest

from megarl.rollout import vllm_groups
from megarl.rollout.vllm_groups import check_tp_groups, consecutive_groups, host_tag, remove_stale_shm

pytestmark = pytest.mark.unit


def test_consecutive_groups_are_vllms_default():
    assert consecutive_groups(4, 2) == [[0, 1], [2, 3]]
    assert consecutive_groups(4, 1) == [[0], [1], [2], [3]]


def test_strided_groups_are_accepted():
    assert check_tp_groups([[0, 2], [1, 3]], 4) == 2
    assert check_tp_groups([[0, 2, 4, 6], [1, 3, 5, 7]], 8) == 4


@pytest.mark.parametrize(
    "groups, match",
    [
        ([[0, 1], [2]], "same, non-zero size"),
        ([[0, 1], [1, 2]], "exactly once"),
        ([[0, 1]], "exactly once"),
        ([[]], "same, non-zero size"),
    ],
)
def test_bad_groups_are_rejected(groups, match):
    with pytest.raises(ValueError, match=match):
        check_tp_groups(groups, 4)


def test_installed_vllm_is_the_pinned_version():
    vllm_groups.check_vllm_version()


def test_only_segments_of_ended_runs_on_this_host_are_removed(tmp_path):
    ended = subprocess.Popen(["true"])
    ended.wait()
    here, live = host_tag(), os.getpid()
    names = {
        f"megarl-{here}.{ended.pid}.0-tp:0-[0-1]-cpushm_0": True,  # killed run of this host
        f"megarl-{here}.{ended.pid}.3-tp:1-[1-3]-cpushm_1": True,
        f"megarl-{here}.{live}.0-tp:0-[0-1]-cpushm_0": False,  # a running engine
        f"megarl-00000000.{ended.pid}.0-tp:0-[0-1]-cpushm_0": False,  # another host's
        "-tp:0-[0-1]-cpushm_0": False,  # not megarl's naming
        f"megarl-{here}.{ended.pid}.0-unrelated": False,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    removed = remove_stale_shm(tmp_path)
    assert sorted(removed) == sorted(n for n, gone in names.items() if gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, gone in names.items() if not gone)
