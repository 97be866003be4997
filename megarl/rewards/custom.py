"""Loading a user's reward function from a file (`reward.function.path` + `reward.function.name`)."""

from __future__ import annotations

import os

from megarl.errors import EXIT_FAILED, EXIT_USAGE, MegarlError
from megarl.rewards.registry import RewardFn
from megarl.user_files import import_file


class RewardError(MegarlError, ValueError):
    """A reward that cannot be computed at all (as opposed to one row's failure); says how to fix it."""

    exit_code = EXIT_USAGE


class RewardFunctionError(RewardError):
    """A step whose reward function failed on too many rows (reward.max_error_fraction): the run stops."""

    exit_code = EXIT_FAILED


def load_reward_function(path: str, name: str = "compute_score") -> RewardFn:
    """The function `name` defined in the Python file at `path` (imported as a module of its own, so
    the file can import its neighbours as verl reward files do)."""
    if not os.path.isfile(path):
        raise RewardError(f"reward.function.path={path} does not exist; point it at a .py file")
    try:
        module = import_file(path, "megarl_reward_")
    except SystemExit as e:  # not the run's exit code: say which file ended it
        raise RewardError(
            f"reward.function.path={path} called sys.exit({e.code!r}) while being imported; a reward file "
            'must only define functions at import (move the code under `if __name__ == "__main__":`)'
        ) from None
    except Exception as e:
        raise RewardError(
            f"reward.function.path={path} failed to import: {type(e).__name__}: {e}; fix the file"
        ) from e
    if module is None:
        raise RewardError(f"reward.function.path={path} is not a Python file; point it at a .py file")
    module_name = module.__name__
    fn = getattr(module, name, None)
    if not callable(fn):
        found = (
            "does not define it" if fn is None else f"defines {name} as {type(fn).__name__}, not a function"
        )
        defined = sorted(
            k
            for k, v in vars(module).items()
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module_name
        )
        fix = (
            f"set reward.function.name to one of its functions: {', '.join(defined)}"
            if defined
            else f"define `def {name}(data_source, solution_str, ground_truth, extra_info=None)` in it"
        )
        raise RewardError(f"{path} has no reward function {name!r}: it {found}; {fix}")
    return fn
