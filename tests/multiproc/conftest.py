"""One 4-rank launch shared by the modules whose checks are 4-rank rank programs (shared_launch.py).

A module takes part by defining SHARED_PART = (name, "module[:function]", argv_of), argv_of(request) giving
its program's argv (it may ask for fixtures: request.getfixturevalue); its tests read
`shared_result(shared_launch, name)`. Only the modules with selected tests run their part, in ORDER.
"""

from __future__ import annotations

import json

import pytest

# spmd first: it checks worker groups on ranks that hold no megatron state yet
ORDER = ("spmd", "reshard", "fsdp_sync", "policy", "parity")


@pytest.fixture(scope="session")
def shared_launch(request, torchrun) -> dict:
    """{part name: {"result": …} or {"error": …, "traceback": …}} of one launch of every selected part."""
    modules = {item.module for item in request.session.items if item.module is not None}
    parts = [part for module in modules if (part := getattr(module, "SHARED_PART", None))]
    unknown = [name for name, _, _ in parts if name not in ORDER]
    assert not unknown, f"tests/multiproc/conftest.py: add {unknown} to ORDER"
    parts.sort(key=lambda part: ORDER.index(part[0]))
    spec = [[name, target, [str(a) for a in argv_of(request)]] for name, target, argv_of in parts]
    return torchrun("tests.multiproc.shared_launch", [json.dumps(spec)], nproc=4, timeout=1500).results[0]


def shared_result(shared_launch: dict, name: str):
    """What part `name` returned on rank 0 of the shared launch (the test fails with its error)."""
    if name not in shared_launch:
        pytest.fail(f"part {name} did not run in the shared launch (is its module's SHARED_PART set?)")
    part = shared_launch[name]
    if "error" in part:
        pytest.fail(f"part {name} of the shared launch raised {part['error']}\n{part['traceback']}")
    return part["result"]
