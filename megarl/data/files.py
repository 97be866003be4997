"""Reading prompt files: parquet and JSON lines (or a JSON list), one plain dict per row, no pandas.

Rows come back as `RawRow(where, value)`: `where` names the file and row for messages ("train.parquet
row 7", "train.jsonl line 8"), `value` is the row's dict or, for a line that is not a JSON object, the
reason it could not be read. Nothing is dropped here; `megarl.data.datasets` decides what is usable.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from megarl.config.data_files import DATA_SUFFIXES, directory_problem
from megarl.errors import EXIT_USAGE, MegarlError


class DataError(MegarlError, ValueError):
    """A dataset that cannot be used; the message names the files, the rows and the fix."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class RawRow:
    where: str  # "file row N" (parquet, JSON list: 0-based) or "file line N" (JSON lines: 1-based)
    value: dict[str, Any] | str  # the row, or why it is unreadable


def file_and_row(where: str) -> tuple[str, str]:
    """("train.parquet", "row 7") of a RawRow's `where`."""
    name, kind, number = where.rsplit(" ", 2)
    return name, f"{kind} {number}"


def per_file(wheres: list[str], shown: int = 5) -> str:
    """Rows grouped by file, counted, the first few named: "a.jsonl: 2 (line 2, line 3), b.parquet: 1 (row 0)"."""
    by_file: dict[str, list[str]] = {}
    for where in wheres:
        name, row = file_and_row(where)
        by_file.setdefault(name, []).append(row)
    parts = []
    for name, rows in by_file.items():
        more = f", ... ({len(rows) - shown} more)" if len(rows) > shown else ""
        parts.append(f"{name}: {len(rows)} ({', '.join(rows[:shown])}{more})")
    return ", ".join(parts)


def fingerprint_files(paths: list[str]) -> list[dict[str, Any]]:
    """[{path, bytes, sha256}] of each file, its bytes streamed through SHA-256 (≈ 1–2 GB/s): what a
    checkpoint keeps to tell, on resume, whether the training data is the same (not only as many rows)."""
    import hashlib

    out = []
    for path in paths:
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        out.append({"path": os.path.abspath(path), "bytes": os.path.getsize(path), "sha256": digest})
    return out


def read_rows(path: str, config_key: str) -> list[RawRow]:
    """Every row of one parquet / jsonl / json file. A missing or unreadable file raises `DataError`
    naming `config_key` (e.g. "data.train_files")."""
    name = os.path.basename(path)
    if directory := directory_problem(path):
        raise DataError(f"{config_key}: {path} {directory}")
    if not os.path.isfile(path):
        raise DataError(
            f"{config_key}: {path} does not exist; fix the path ({config_key}=[path/to/train.parquet]) or "
            "create the dataset first (e.g. `megarl data make digits_sort --out DIR`)"
        )
    if not path.endswith(DATA_SUFFIXES):
        raise DataError(
            f"{config_key}: {path} has an unsupported format; use a {', '.join(DATA_SUFFIXES)} file"
        )
    try:
        if path.endswith(".parquet"):
            return _parquet_rows(path, name)
        return _json_rows(path, name)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        reason = " ".join(str(e).split())
        kind = "parquet" if path.endswith(".parquet") else "UTF-8 JSON text"
        raise DataError(
            f"{config_key}: {path} could not be read ({type(e).__name__}: {reason}); it is not {kind}: "
            "re-export the data set, or name the right file"
        ) from None


def _parquet_rows(path: str, name: str) -> list[RawRow]:
    import pyarrow.parquet as pq

    return [RawRow(f"{name} row {i}", row) for i, row in enumerate(pq.read_table(path).to_pylist())]


def _json_rows(path: str, name: str) -> list[RawRow]:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json") and text.lstrip().startswith("["):
        return [_object(f"{name} row {i}", row) for i, row in enumerate(json.loads(text))]
    if path.endswith(".json") and _column_oriented(text):
        raise DataError(
            f"{path} holds one JSON object of columns ({{column: {{row index: value}}}}, what pandas' "
            "DataFrame.to_json() writes by default), not rows; write the rows instead: "
            "df.to_json('train.jsonl', orient='records', lines=True), or df.to_parquet('train.parquet')"
        )
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(_object(f"{name} line {number}", json.loads(line)))
        except json.JSONDecodeError as e:
            rows.append(RawRow(f"{name} line {number}", f"not valid JSON ({e.msg})"))
    return rows


def _column_oriented(text: str) -> bool:
    """A whole-file JSON object whose values are all {row index: value} mappings."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(value, dict)
        and bool(value)
        and all(isinstance(col, dict) and col and all(k.isdigit() for k in col) for col in value.values())
    )


def _object(where: str, value: Any) -> RawRow:
    if isinstance(value, dict):
        return RawRow(where, value)
    return RawRow(where, f"not a JSON object (got {type(value).__name__})")
