"""Every error megarl raises on purpose is a `MegarlError` carrying the exit code `megarl` ends with,
and keeps the builtin base callers catch it as."""

import ast
import builtins
import importlib
from pathlib import Path

import pytest

from megarl.cli.errors import report_error
from megarl.errors import EXIT_FAILED, EXIT_PREEMPTED, EXIT_USAGE, MegarlError

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "megarl"
BUILTIN_ERRORS = {
    name for name, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
}

ERRORS = [  # module, class, builtin base, exit code
    ("megarl.cli.errors", "UsageError", Exception, EXIT_USAGE),
    ("megarl.config.errors", "ConfigError", ValueError, EXIT_USAGE),
    ("megarl.controller.faults", "FaultSpecError", ValueError, EXIT_USAGE),
    ("megarl.controller.resource_pool", "ResourcePoolError", RuntimeError, EXIT_USAGE),
    ("megarl.data.files", "DataError", ValueError, EXIT_USAGE),
    ("megarl.distributed.layout", "LayoutError", ValueError, EXIT_USAGE),
    ("megarl.checkpoint.format", "CheckpointError", ValueError, EXIT_USAGE),
    ("megarl.checkpoint.paths", "CheckpointNotFoundError", FileNotFoundError, EXIT_USAGE),
    ("megarl.models.from_hf", "UnsupportedModelError", ValueError, EXIT_USAGE),
    ("megarl.rewards.custom", "RewardError", ValueError, EXIT_USAGE),
    ("megarl.rewards.registry", "UnknownDataSource", KeyError, EXIT_USAGE),
    ("megarl.rewards.custom", "RewardFunctionError", ValueError, EXIT_FAILED),
    ("megarl.rewards.pool", "RewardPoolError", RuntimeError, EXIT_FAILED),
    ("megarl.checkpoint.run", "ResumeError", ValueError, EXIT_USAGE),
    ("megarl.trainer.dataflow", "DataflowError", ValueError, EXIT_USAGE),
    ("megarl.controller.faults", "InjectedFault", RuntimeError, EXIT_FAILED),
    ("megarl.controller.worker", "RemoteError", RuntimeError, EXIT_FAILED),
    ("megarl.controller.worker", "WorkerError", RuntimeError, EXIT_FAILED),
    ("megarl.trainer.bad_steps", "BadStepsError", RuntimeError, EXIT_FAILED),
    ("megarl.trainer.scoring", "DynamicSamplingError", RuntimeError, EXIT_FAILED),
    ("megarl.distributed.preemption", "Preempted", Exception, EXIT_PREEMPTED),
]


@pytest.mark.parametrize("module, name, base, exit_code", ERRORS, ids=[e[1] for e in ERRORS])
def test_each_error_is_a_megarl_error_with_its_exit_code(module, name, base, exit_code):
    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, MegarlError) and issubclass(error, base)
    assert error.exit_code == exit_code


# control flow that never leaves its process: a reward worker's time limit is a BaseException so that a
# reward function's own `except Exception` cannot swallow it (the worker turns it into a failed row)
INTERNAL = {"megarl/rewards/calls.py: RewardTimeout"}


def test_no_error_class_bypasses_megarl_error():
    """A new error class deriving straight from a builtin exception fails here: give it MegarlError."""
    bypassing = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name != "MegarlError":
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & BUILTIN_ERRORS and "MegarlError" not in bases:
                    bypassing.append(f"{path.relative_to(PACKAGE.parent)}: {node.name}")
    assert sorted(set(bypassing) - INTERNAL) == []


def test_the_command_line_names_the_command_and_exits_with_the_errors_code(capsys):
    from megarl.config.errors import ConfigError
    from megarl.controller.worker import WorkerError

    assert report_error("sft", ConfigError(["data.train_files is empty"])) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("megarl sft: error: invalid megarl config (1 problem):")
    assert report_error("train", WorkerError("actor.update failed on rank 1", "actor")) == EXIT_FAILED
    assert capsys.readouterr().err == "megarl train: actor.update failed on rank 1\n"
    assert report_error("report", FileNotFoundError("runs/x has no metrics.jsonl")) == EXIT_USAGE
    assert capsys.readouterr().err == "megarl report: error: runs/x has no metrics.jsonl\n"
