"""Each named CPU shim is needed: without it its megatron call fails, with it the call succeeds."""

import pytest

from megarl.distributed.cpu_shims import SHIMS

pytestmark = pytest.mark.multiproc


@pytest.fixture(scope="module")
def shim_results(torchrun):
    return torchrun("tests.multiproc.shim_checks", [], nproc=2).results[0]


@pytest.mark.parametrize("shim", sorted(SHIMS))
def test_shim_is_needed_and_sufficient(shim_results, shim):
    outcome = shim_results[shim]
    assert not outcome["ok_without"], f"{shim} no longer seems needed: its check passed without it"
    assert outcome["ok_with"], f"{shim} applied, yet its check failed: {outcome['error_with']}"
