"""Each named CPU shim is needed: without it its megatron call fails, with it the call succeeds. Its rank
program runs first in the 2-rank launch shared with other modules (tests/multiproc/conftest.py)."""

import pytest

from megarl.distributed.cpu_shims import SHIMS
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

SHARED_PART_2 = ("cpu_shims", "tests.multiproc.shim_checks", lambda request: [])


@pytest.fixture(scope="module")
def shim_results(shared_launch_2):
    return shared_result(shared_launch_2, "cpu_shims")


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_shim_is_needed_and_sufficient(shim_results, shim):
    outcome = shim_results[shim]
    assert not outcome["ok_without"], f"{shim} no longer seems needed: its check passed without it"
    assert outcome["ok_with"], f"{shim} applied, yet its check failed: {outcome['error_with']}"
