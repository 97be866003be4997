"""Generation TP groups handed to vLLM: validation, vLLM's default grouping, and the version pin."""

from __future__ import annotations

import pytest

from megarl.rollout import vllm_groups
from megarl.rollout.vllm_groups import check_tp_groups, consecutive_groups

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
