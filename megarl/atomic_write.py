"""Replace a small text file atomically: a reader (or a run that dies mid-write) sees the old file or
the new one, never half of one."""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomically(path: str | Path, text: str, durable: bool = False) -> None:
    """Write `text` to a temporary file beside `path` and rename it over `path`. `durable` also
    fsyncs the data before the rename (for files that must survive a machine crash: `latest`)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
