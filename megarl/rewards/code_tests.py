"""Code rewards (`codecontests`, `apps`, `codeforces`, `taco`): the response's program run against the
row's tests on this machine, as verl scores these sources without a sandbox service (`prime_code`,
`continuous=True`): 1.0 when every test passes, else the share of the first 10 tests that pass (0 for
call-based tests, as in verl 0.9.1, whose per-test pass loses the `fn_name`).

The program is the text after the response's last "```python" up to the next "```" (the whole response
when it has no fence). The ground truth is verl's JSON (a string or a dict): `{"inputs": [...], "outputs":
[...]}` for programs that read stdin and print, plus `"fn_name"` for call-based tests (each input is one
JSON value per line, the arguments; the output one JSON value; a `class Solution` is instantiated first).

A row's tests run in one fresh `python -I` process in an empty temporary directory, each test in a fork
of it with `TEST_TIMEOUT_S` of wall time, a CPU-time and an address-space limit, and its own process
group (killed whole on a timeout). This contains a program's crash, hang or memory hog; it is not a security boundary
against hostile code (no network or file-system isolation): run untrusted generations in a container.
Run inside a reward worker, the row still has reward.timeout_s in all: raise it for code sources (10
tests of a slow program take up to 10 × TEST_TIMEOUT_S).

Output comparison (stdin programs): the printed lines against the expected ones, both stripped and with
blank lines dropped; equal lines, or lines with equal whitespace-separated tokens, or numbers all close
(relative 1e-5, absolute 1e-8) pass. verl's checker has further, looser fallbacks (docs/verl-rewards.md).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

TEST_TIMEOUT_S = 5.0
MAX_SCORED_TESTS = 10  # the partial score counts the first 10 tests, as verl's continuous score does
MEMORY_LIMIT_BYTES = 2 << 30

# What verl's runner has in scope before the program: star imports of common modules (a program that
# calls `sqrt` or `Counter` without importing them runs there, so it runs here too).
_PRELUDE_MODULES = (
    "string re datetime collections heapq bisect copy math random statistics itertools functools operator io "
    "sys json builtins typing"
).split()
PRELUDE = "".join(f"from {m} import *\n" for m in _PRELUDE_MODULES) + "".join(
    f"import {m}\n" for m in _PRELUDE_MODULES if m not in ("builtins", "typing")
)
PRELUDE += "sys.setrecursionlimit(6 * 10**5)\n"

# The child's driver: imports the prelude and compiles the program once, then runs each test in a fork of
# itself (fork is milliseconds; a fresh interpreter with the prelude is ~0.1-1 s on a busy machine) with the
# test's input as stdin, under the CPU and memory limits, killed with its process group past the time limit.
# stdin: JSON {"program", "fn_name", "tests": [input, ...], "timeout_s", "stop_on_fail"}; stdout: JSON
# [[exit code or null (timed out), printed text], ...]. A stdin program's sys.exit ends the program, not the
# test (verl's runner catches SystemExit too); a call-based test prints the JSON result on its last line.
_DRIVER = """
import io, json, os, resource, select, signal, sys, tempfile, time
job = json.load(sys.stdin)
out_stream = sys.stdout
scope = {"__name__": "__main__"}
exec(job["prelude"], scope)
code = compile(job["program"], "<solution>", "exec")
limit = job["timeout_s"]

def run_one(given):
    inp = tempfile.TemporaryFile()
    inp.write(given.encode() if job["fn_name"] is None else b"")
    inp.seek(0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            resource.setrlimit(resource.RLIMIT_AS, (job["memory"], job["memory"]))
            cpu = int(limit) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
            os.dup2(inp.fileno(), 0)
            os.dup2(w, 1)
            sys.stdin = open(0, "r", closefd=False)
            sys.stdout = open(1, "w", closefd=False)
            own = dict(scope, stdin=sys.stdin, stdout=sys.stdout)  # the prelude's `from sys import *` names
            try:
                exec(code, own)
                if job["fn_name"] is not None:
                    target = own["Solution"]() if "class Solution" in job["program"] else None
                    fn = getattr(target, job["fn_name"]) if target is not None else own[job["fn_name"]]
                    sys.stdout.write("\\n" + json.dumps(fn(*json.loads(given))))
            except SystemExit:
                if job["fn_name"] is not None:
                    raise
            sys.stdout.flush()
            os._exit(0)
        except BaseException:
            os._exit(1)
    os.close(w)
    chunks, deadline, timed_out = [], time.monotonic() + limit, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            timed_out = True
            break
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    if timed_out:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.close(r)
    _, status = os.waitpid(pid, 0)
    code_ = None if timed_out else (os.waitstatus_to_exitcode(status))
    return [code_, b"".join(chunks).decode(errors="replace")]

results = []
for given in job["tests"]:
    results.append(run_one(given))
    if job["stop_on_fail"] and results[-1][0] != 0:
        break
out_stream.write(json.dumps(results))
"""


def extract_program(response: str) -> str:
    return response.split("```python")[-1].split("```")[0]


def _run_tests(
    program: str, fn_name: str | None, inputs: list[str], stop_on_fail: bool
) -> list[tuple[int | None, str]]:
    """(exit code or None when it timed out, printed text) of each test, from one child process (in an empty
    temporary directory) that runs each in a fork; a program that does not compile fails every test."""
    job = {
        "prelude": PRELUDE,
        "program": program,
        "fn_name": fn_name,
        "tests": inputs,
        "timeout_s": TEST_TIMEOUT_S,
        "memory": MEMORY_LIMIT_BYTES,
        "stop_on_fail": stop_on_fail,
    }
    with tempfile.TemporaryDirectory(prefix="megarl-code-") as cwd:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _DRIVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env={"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"},
            start_new_session=True,
            text=True,
        )
        try:
            out, _ = proc.communicate(json.dumps(job), timeout=len(inputs) * (TEST_TIMEOUT_S + 1) + 30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            out = ""
    try:
        return [(code, text) for code, text in json.loads(out)]
    except (json.JSONDecodeError, ValueError):  # no JSON: the program did not compile (or the driver died)
        return [(1, "")] * len(inputs)


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _close_numbers(got: list[str], want: list[str]) -> bool:
    a, b = " ".join(got).split(), " ".join(want).split()
    if len(a) != len(b):
        return False
    try:
        return all(math.isclose(float(x), float(y), rel_tol=1e-5, abs_tol=1e-8) for x, y in zip(a, b))
    except ValueError:
        return False


def same_output(printed: str, expected: Any) -> bool:
    """Whether a stdin program's output is the expected one (see the module doc)."""
    want = _lines("\n".join(expected) if isinstance(expected, list) else str(expected))
    got = _lines(printed)
    if got == want:
        return True
    if len(got) == len(want) and all(g.split() == w.split() for g, w in zip(got, want)):
        return True
    return _close_numbers(got, want)


def _same_value(out: Any, expected: Any) -> bool:
    if out == expected:
        return True
    return isinstance(expected, list) and len(expected) > 0 and out == expected[0]


def _passed(ran: tuple[int | None, str], expected: Any, call_based: bool) -> bool:
    code, printed = ran
    if code != 0:
        return False
    if not call_based:
        return same_output(printed, expected)
    try:
        want = json.loads(expected) if isinstance(expected, str) else expected
        return _same_value(json.loads(printed.rsplit("\n", 1)[-1]), want)
    except json.JSONDecodeError:
        return False


def _stdin_text(given: Any) -> str:
    return "\n".join(given) if isinstance(given, list) else str(given)


def run_tests(program: str, tests: dict[str, Any], indices: range, stop_on_fail: bool = False) -> list[bool]:
    """Whether `program` passes each test of `indices` (up to the first failure with `stop_on_fail`)."""
    fn_name = tests.get("fn_name")
    inputs = [_stdin_text(tests["inputs"][i]) for i in indices]
    if fn_name is not None:  # one JSON value per line: the arguments
        try:
            inputs = [json.dumps([json.loads(line) for line in text.split("\n")]) for text in inputs]
        except json.JSONDecodeError:
            return [False] * len(inputs)
    ran = _run_tests(program, None if fn_name is None else str(fn_name), inputs, stop_on_fail)
    return [_passed(r, tests["outputs"][i], fn_name is not None) for r, i in zip(ran, indices)]


def compute_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the program passes every test, else the share of the first 10 tests it passes (0 when
    the tests are call-based)."""
    tests = json.loads(ground_truth) if isinstance(ground_truth, str | bytes) else dict(ground_truth)
    tests = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in tests.items()}  # arrays from parquet
    n = len(tests["inputs"])
    if n == 0:
        raise ValueError("the ground truth has no tests (its 'inputs' list is empty)")
    program = extract_program(solution_str)
    results = run_tests(program, tests, range(min(n, MAX_SCORED_TESTS)))
    if all(results) and (
        n <= MAX_SCORED_TESTS or all(run_tests(program, tests, range(MAX_SCORED_TESTS, n), True))
    ):
        return 1.0
    if tests.get("fn_name") is not None:
        return 0.0  # verl 0.9.1's per-test pass drops fn_name, so call-based programs score all or nothing
    return sum(results) / len(results)
