"""A user's reward file checked before any worker starts: imported in a short-lived process of its own (an
`os._exit`, a segfault or a hang at import ends that process, not the driver) and its function's
signature bound against verl's call, `fn(data_source=..., solution_str=..., ground_truth=...,
extra_info=...)`. `check_reward_file(path, name)` raises `RewardError` saying what is wrong and how to fix it.

    python -m megarl.rewards.function_check PATH NAME RESULT_FILE   # the child; writes "" or the problem
"""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from megarl.rewards.custom import RewardError, load_reward_function

VERL_CALL = ("data_source", "solution_str", "ground_truth", "extra_info")
IMPORT_TIMEOUT_S = 120.0  # a reward file that imports a large library may take a while; a hang does not end
_checked: dict[tuple[str, str, float], None] = {}  # (path, name, mtime) already checked by this process


def signature_problem(fn: Callable[..., Any], path: str, name: str) -> str | None:
    """Why verl's call cannot bind to `fn`'s parameters, with the fix; None when it can (keyword or
    positional-or-keyword parameters, **kwargs, defaults for anything else: what verl's call accepts)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function: nothing to check here
        return None
    try:
        sig.bind(**dict.fromkeys(VERL_CALL))
        return None
    except TypeError:
        pass
    params = sig.parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    missing = [
        n
        for n in VERL_CALL
        if (n not in params and not takes_kwargs)
        or (n in params and params[n].kind is params[n].POSITIONAL_ONLY)
    ]
    required = [
        n
        for n, p in params.items()
        if n not in VERL_CALL and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    what = []
    if missing:
        what.append(f"has no parameter {' or '.join(missing)}")
    if required:
        what.append(f"requires {', '.join(required)}, which verl's call does not pass")
    call = f"{name}(data_source=..., solution_str=..., ground_truth=..., extra_info=...)"
    head = (
        f"reward.function.name={name} in reward.function.path={path} cannot be called as verl and megarl call "
        f"it, {call}: {name}{sig} {' and '.join(what) or 'does not accept these keywords'}"
    )
    if "data_source" in missing and "solution_str" in params and "ground_truth" in params:
        stem = os.path.splitext(os.path.basename(path))[0]
        return (
            f"{head}. This is one of verl's per-source scorers (verl/utils/reward_score/*.py, e.g. gsm8k.py's "
            "compute_score(solution_str, ground_truth, method=..., ...)), not a reward function. Either remove "
            "reward.function to score with megarl's rule reward for the rows' data_source (docs/verl-rewards.md "
            "lists them), or wrap it: a file of your own with `def compute_score(data_source, solution_str, "
            "ground_truth, extra_info=None): return verl_score(solution_str, ground_truth)`, where verl_score is "
            f"this function, pasted in or imported (`from {stem} import {name} as verl_score`, with "
            f"{os.path.dirname(os.path.abspath(path))} on PYTHONPATH)"
        )
    fixes = []
    if missing:
        fixes.append(f"add the parameter{'s' * (len(missing) > 1)} {', '.join(missing)} (or **kwargs)")
    if required:
        fixes.append(f"give {', '.join(required)} a default")
    return f"{head}; {' and '.join(fixes) or 'make them keyword parameters'}"


def check_reward_file(path: str, name: str, timeout_s: float = IMPORT_TIMEOUT_S) -> None:
    """Import `path` in a child process and bind verl's call to its function `name`; `RewardError` if
    either fails (a crash, an `os._exit` or a hang at import included). Checked once per file version."""
    if not os.path.isfile(path):
        raise RewardError(f"reward.function.path={path} does not exist; point it at a .py file")
    key = (os.path.abspath(path), name, os.path.getmtime(path))
    if key in _checked:
        return
    with tempfile.NamedTemporaryFile("r", suffix=".txt", prefix="megarl-reward-check-") as result:
        cmd = [
            sys.executable,
            "-m",
            "megarl.rewards.function_check",
            os.path.abspath(path),
            name,
            result.name,
        ]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            done = subprocess.run(
                cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise RewardError(
                f"reward.function.path={path} did not finish importing within {timeout_s:g}s (checked in a process "
                "of its own); a reward file must only define functions at import: move long-running code "
                'into the function or under `if __name__ == "__main__":`'
            ) from None
        problem = result.read()
    if done.returncode == 0:
        if problem:
            raise RewardError(problem)
        _checked[key] = None
        return
    if problem:  # the child reported it, then exited 1
        raise RewardError(problem)
    if done.returncode < 0:
        try:
            how = f"died with signal {-done.returncode} ({signal.Signals(-done.returncode).name})"
        except ValueError:
            how = f"died with signal {-done.returncode}"
    else:
        how = (
            f"ended the process with exit code {done.returncode} (os._exit, or a library ending the process)"
        )
    tail = "\n".join(done.stderr.strip().splitlines()[-5:])
    raise RewardError(
        f"reward.function.path={path} {how} while being imported (checked in a process of its own, before "
        "any worker starts); a reward file must only define functions at import: move such code into the "
        f'function or under `if __name__ == "__main__":`' + (f"; its last output:\n{tail}" if tail else "")
    )


def _main(path: str, name: str, result_file: str) -> int:
    try:
        fn = load_reward_function(path, name)
        problem = signature_problem(fn, path, name) or ""
    except RewardError as e:
        problem = str(e)
    with open(result_file, "w") as f:
        f.write(problem)
    sys.stdout.flush()
    os._exit(1 if problem else 0)  # no atexit or non-daemon threads the file may have started


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2], sys.argv[3]))
