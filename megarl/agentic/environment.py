"""Environments for multi-turn tasks that are not tool calls (a simulated user, a game).

A user class, named by `rollout.multi_turn.environment: path/to/file.py:ClassName` (or
`package.module:ClassName`), is constructed with no arguments once per conversation:

```python
class Guess:
    def reset(self, sample: dict) -> None:            # the dataset row: raw_prompt, ground_truth, extra_info…
        self.target = int(sample["ground_truth"])
    def step(self, action_text: str) -> tuple[str, float, bool]:
        ...                                            # (the next user message, this turn's reward, done)
```
Each turn's reward becomes that turn's score (`turn_scores`, on its last generated token). A class
that raises ends its conversation, counted in `agent/env_errors`, never the run.
"""

from __future__ import annotations

import importlib
import inspect
import os

from megarl.errors import EXIT_USAGE, MegarlError
from megarl.user_files import import_file

KEY = "rollout.multi_turn.environment"


class UserObjectError(MegarlError, ValueError):
    """A user class or function named in the config cannot be loaded; the message names the key, the
    file and the fix."""

    exit_code = EXIT_USAGE


def load_object(spec: str, key: str):
    """The object named by `path/to/file.py:Name` or `package.module:Name`."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name:
        raise UserObjectError(f"{key}={spec!r}: write it as path/to/file.py:Name or package.module:Name")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            raise UserObjectError(f"{key}={spec!r}: no file {where} (a path relative to where megarl runs)")
        try:
            module = import_file(where, "megarl_user_")
        except Exception as e:
            raise UserObjectError(
                f"{key}={spec!r}: importing {where} failed: {type(e).__name__}: {e}"
            ) from None
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UserObjectError(f"{key}={spec!r}: cannot import {where}: {e}") from None
    if not hasattr(module, name):
        raise UserObjectError(f"{key}={spec!r}: {where} has no {name!r}")
    return getattr(module, name)


def environment_problems(spec: str) -> list[str]:
    """Why `spec` is not a usable environment class (empty when it is)."""
    try:
        cls = load_object(spec, KEY)
    except UserObjectError as e:
        return [str(e)]
    if not inspect.isclass(cls):
        return [
            f"{KEY}={spec!r} is a {type(cls).__name__}, not a class with reset(sample) and step(action_text)"
        ]
    missing = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if missing:
        return [
            f"{KEY}={spec!r}: the class has no {' or '.join(missing)} method (reset(sample), step(action_text))"
        ]
    return []


def load_environment(spec: str) -> type:
    problems = environment_problems(spec)
    if problems:
        raise UserObjectError(problems[0])
    return load_object(spec, KEY)
