"""Run the error probe (tests/helpers/error_probe*.py) and write docs/error-probe.md: every case, the
message `megarl` prints for it now, its exit code and the test that asserts it.

    PYTHONPATH=. python tools/error_probe.py [--out docs/error-probe.md]

Cases that need a launch are listed with the message their test asserts. Exits 1 when a case no longer
prints what the table expects (tests/unit/test_probe.py fails the same way).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.error_probe import Case, Outcome, Unavailable, Workspace, run_case  # noqa: E402
from tests.helpers.error_probe_cases import ALL_CASES  # noqa: E402

HEADER = """# The error probe: {n} cases, each with the message megarl prints

What a new user and an adversary fed megarl (issue 39's probe, rebuilt as megarl's own): configs, layouts,
models, data files, reward functions, checkpoints, resume, conversion, disk, signals, concurrent runs,
security. Each row: the input, the message as printed (paths shortened: `<case>` is the case's own
directory, `<tmp>` the probe's workspace), the exit code (2: input rejected before anything started;
1: a run that failed; 75: stopped by a signal, rerun to resume; 130: Ctrl-C; 0: accepted) and the test
that asserts it. Rows whose test is `tests/unit/test_probe.py::test_probe_case` were run by
`tools/error_probe.py` through `megarl.cli.main` (the `megarl` command's code path) in one process, with
no worker started; the others need a launch or a fault injected mid-run, and quote their test's message.
I01–I29 are the 29 cases issue 39 names.

Regenerate: `PYTHONPATH=. python tools/error_probe.py` (≈ {seconds:.0f} s).

| id | category | case | message | exit | test |
|---|---|---|---|---|---|
"""


def cell(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace("|", "\\|").replace("\n", "<br>")


def row(case: Case, outcome: Outcome | None) -> str:
    """One table row: the message printed now (or, for a case run elsewhere, the one its test asserts)."""
    tests = [f"`{case.test}`"] if not case.test.endswith("test_probe_case") else []
    if outcome is not None:
        tests.append(f"`tests/unit/test_probe.py::test_probe_case[{case.id}]`")
        message, code = outcome.message, outcome.exit_code
    else:
        message, code = f"(as its test asserts) {case.message}", case.exit_code
    return f"| {case.id} | {case.category} | {cell(case.case)} | {cell(message)} | {code} | {'<br>'.join(tests)} |\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "error-probe.md"))
    args = parser.parse_args()
    start = time.perf_counter()
    rows, wrong = [], []
    with tempfile.TemporaryDirectory(prefix="megarl-probe-") as root:
        ws = Workspace(Path(root))
        try:
            for case in ALL_CASES:
                outcome = None
                if case.make is not None:
                    try:
                        outcome = run_case(case, ws)
                    except Unavailable as e:
                        print(f"{case.id}: skipped ({e})", file=sys.stderr)
                    else:
                        missing = [f for f in case.expect if f not in outcome.message]
                        if outcome.exit_code != case.exit_code or missing:
                            wrong.append(
                                f"{case.id}: exit {outcome.exit_code}, missing {missing}:\n{outcome.message}"
                            )
                rows.append(row(case, outcome))
        finally:
            ws.close()
    seconds = time.perf_counter() - start
    Path(args.out).write_text(HEADER.format(n=len(ALL_CASES), seconds=seconds) + "".join(rows))
    print(f"{len(ALL_CASES)} cases in {seconds:.0f} s -> {args.out}")
    for problem in wrong:
        print(problem, file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
