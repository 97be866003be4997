"""Megatron's save gets its writers' results through an in-process queue: no multiprocessing Manager (a
spawned interpreter, ~3 s of the first save of every process on CPU) is started."""

from __future__ import annotations

import queue

import psutil
import pytest

from megarl.checkpoint.format import write_results_in_process

pytestmark = pytest.mark.unit


def test_the_results_queue_is_in_process_and_starts_no_process(monkeypatch):
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    monkeypatch.setattr(filesystem_async, "_results_queue", None)
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    write_results_in_process()
    write_results_in_process()  # idempotent: the same queue
    results = filesystem_async._get_write_results_queue()
    assert isinstance(results, queue.Queue) and results is filesystem_async._results_queue
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    # what write_preloaded_data_multiproc puts, retrieve_write_results takes (get_nowait; Empty if none)
    results.put({0: ["written"]})
    assert results.get_nowait() == {0: ["written"]}
    with pytest.raises(queue.Empty):
        results.get_nowait()
