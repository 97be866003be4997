"""Data files as a config names them (data.train_files, data.val_files): parquet, JSON lines or a JSON
list, each a file. Checked at load (`megarl.config.validate`) and again where the rows are read
(`megarl.data.files`), with the same words."""

from __future__ import annotations

import os

__all__ = ["DATA_SUFFIXES", "directory_problem"]

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
_SHOWN = 3  # files named in the message


def directory_problem(path: str) -> str | None:
    """Why `path`, a directory (a partitioned parquet data set is one, named like a file), is not a data
    file, and the files in it to list instead; None when it is no directory."""
    if not os.path.isdir(path):
        return None
    inside = sorted(os.path.join(path, name) for name in os.listdir(path) if name.endswith(DATA_SUFFIXES))
    if not inside:
        return (
            "is a directory, not a data file, and holds no .parquet, .jsonl or .json file; name a data file"
        )
    more = f", ... ({len(inside) - _SHOWN} more)" if len(inside) > _SHOWN else ""
    return f"is a directory, not a data file; list the data files in it instead: [{', '.join(inside[:_SHOWN])}{more}]"
