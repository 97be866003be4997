"""How every `megarl` command ends on an error: one line naming the command, and the error's exit code."""

from __future__ import annotations

from megarl.errors import EXIT_USAGE, MegarlError
from megarl.observe.worker_logs import console_errors


class UsageError(MegarlError):
    """Bad input found before any process starts; the message says how to fix it."""

    exit_code = EXIT_USAGE


def report_error(command: str, error: MegarlError | OSError) -> int:
    """Print `megarl COMMAND: error: MESSAGE` for rejected input (a file that cannot be read or written
    included), `megarl COMMAND: MESSAGE` for a run that failed (its message says where); returns the
    exit code."""
    code = error.exit_code if isinstance(error, MegarlError) else EXIT_USAGE
    label = "error: " if code == EXIT_USAGE else ""
    print(f"megarl {command}: {label}{error}", file=console_errors())  # the terminal, not a rank log
    return code
