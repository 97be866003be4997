"""The `python` tool's sandbox: code runs in its own process and directory, and each limit stops
what it is for — CPU time, memory, network, writes outside the directory, output size, a hang."""

from __future__ import annotations

import os
import socket
import time

import pytest

from megarl.agentic.tools import ToolCall, ToolOutcome, ToolSet
from megarl.agentic.tools.sandbox import SandboxLimits, network_namespace_available, run_python

pytestmark = pytest.mark.unit

LIMITS = SandboxLimits(cpu_s=1, memory_mb=512, file_mb=1, output_chars=1000)


def test_runs_code_and_returns_its_output():
    result = run_python("import sys\nprint(sum(range(10)))\nprint('note', file=sys.stderr)", 10, LIMITS)
    assert (result.status, result.output) == ("ok", "45\nnote\n")
    assert run_python("import numpy\nprint(numpy.arange(4).sum())", 10, LIMITS).output == "6\n"


def test_exception_gives_output_then_its_last_line():
    result = run_python("print('before')\nx = 1\n1 / 0", 10, LIMITS)
    assert (result.status, result.output) == (
        "error",
        "before\nError at line 3: ZeroDivisionError: division by zero\n",
    )


def test_cpu_limit_kills_a_busy_loop():
    result = run_python("while True:\n    pass", 60, LIMITS)  # SIGXCPU after 1 s of CPU, long before 60 s
    assert (result.status, result.returncode) == ("cpu_limit", -24)


def test_memory_limit_stops_a_huge_allocation():
    result = run_python("b = bytearray(2 << 30)\nprint(len(b))", 10, LIMITS)
    assert result.status == "error"
    assert result.output == "Error at line 1: MemoryError (the sandbox's memory limit)\n"


def test_cannot_connect_to_a_listening_socket():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        code = f"import socket\ns = socket.socket()\ns.connect(('127.0.0.1', {port}))\nprint('connected')"
        result = run_python(code, 10, LIMITS)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing reached the port
    assert "connected" not in result.output and result.status == "error"
    assert "PermissionError: sandbox: socket.__new__ is not allowed" in result.output


def test_writes_only_inside_its_directory(tmp_path):
    outside = tmp_path / "x"
    code = (
        "open('inside.txt', 'w').write('kept')\nprint(open('inside.txt').read())\n"
        f"import os\nprint(os.getcwd() != {str(tmp_path)!r})\nopen({str(outside)!r}, 'w')"
    )
    result = run_python(code, 10, LIMITS)
    assert result.output.startswith("kept\nTrue\nError at line 5: PermissionError: sandbox: writing")
    assert not outside.exists()
    for escape in [
        "import os\nos.remove('/etc/hostname')",
        "import subprocess\nsubprocess.run(['true'])",
        "import ctypes\nctypes.CDLL(None)",
        "import ctypes\nctypes.string_at(id(1), 8)",  # ctypes stays imported (numpy needs it): calls are refused
        "import os\nfd = os.open('/etc', os.O_RDONLY)",  # a directory fd would allow dir_fd= writes
    ]:
        assert "PermissionError: sandbox:" in run_python(escape, 10, LIMITS).output


def test_output_is_truncated():
    result = run_python("print('x' * 5000)", 10, LIMITS)
    assert result.status == "ok" and result.output == "x" * 1000


def test_hang_is_killed_by_the_wall_clock_timeout():
    start = time.monotonic()
    result = run_python("import time\nprint('started', flush=True)\ntime.sleep(60)", 1.0, LIMITS)
    assert (result.status, result.output) == ("timeout", "started\n")
    assert time.monotonic() - start < 3


def test_python_tool_outcomes_through_the_toolset():
    toolset = ToolSet.from_config(["python"], max_tool_response_length=200, cpu_s=2)
    ok = toolset.call(ToolCall("python", {"code": "print(2**100)"}), timeout_s=10)
    assert (ok.outcome, ok.text) == (ToolOutcome.OK, "1267650600228229401496703205376\n")
    failed = toolset.call(ToolCall("python", {"code": "raise ValueError('bad input')"}), timeout_s=10)
    assert (failed.outcome, failed.text) == (ToolOutcome.RAISED, "Error at line 1: ValueError: bad input")
    hung = toolset.call(ToolCall("python", {"code": "import time\ntime.sleep(30)"}), timeout_s=0.5)
    assert (hung.outcome, hung.text) == (
        ToolOutcome.TIMEOUT,
        "error: the code did not finish within 0.5 s and was stopped",
    )


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX only")
def test_network_namespace_probe_answers():
    assert network_namespace_available() in (True, False)  # which one depends on the kernel; see sandbox.py
