"""The pool bridge: its own gloo group and store, beside (not instead of) a process's default world."""

import threading

import pytest
import torch
import torch.distributed as dist

from megarl.distributed.launch import free_port
from megarl.hybrid.pool_bridge import PoolBridge

pytestmark = pytest.mark.unit


def test_bridge_ranks_exchange_tensors_and_the_pending_version_without_a_default_group():
    port, got, errors = free_port(), {}, []

    def rank(r: int) -> None:
        try:
            bridge = PoolBridge("127.0.0.1", port, r, 2, timeout_s=30)
            if r == 0:
                assert bridge.pending_version() is None  # nothing announced yet: no wait
                bridge.publish("table", {"names": ["a"]})
                bridge.isend(torch.arange(6, dtype=torch.float32), dst=1, tag=3).wait()
                bridge.set_pending_version(7)
            else:
                buf = torch.empty(6)
                bridge.irecv(buf, src=0, tag=3).wait()
                got["tensor"], got["table"] = buf, bridge.read("table")
            bridge.barrier()
            got[f"version{r}"] = bridge.pending_version()
            bridge.barrier()
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not dist.is_initialized()  # the bridge is no one's default group
    assert torch.equal(got["tensor"], torch.arange(6, dtype=torch.float32))
    assert got["table"] == {"names": ["a"]}
    assert got["version0"] == got["version1"] == 7
