"""Writing verl-schema prompt files for data and reward tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq


def verl_row(question: str, answer: str, data_source: str = "openai/gsm8k", **extra: Any) -> dict[str, Any]:
    """One row as verl's GSM8K preprocessing writes it: a chat-list prompt and reward_model.ground_truth."""
    row = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": 0},
    }
    row.update(extra)
    return row


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def write_jsonl(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def digits_val_pairs(data: Path) -> tuple[Path, list[tuple[str, str]]]:
    """The digits task's val problems as preference pairs (the correct answer over the copied digits) in
    `<data>/val_pairs.parquet`, and every problem as (prompt, answer)."""
    rows = pq.read_table(data / "val.parquet").to_pylist()
    problems = [(r["prompt"][0]["content"], r["reward_model"]["ground_truth"]) for r in rows]
    pairs = [{"prompt": p, "chosen": a, "rejected": p.split()[-1]} for p, a in problems if a != p.split()[-1]]
    path = data / "val_pairs.parquet"
    pq.write_table(pa.Table.from_pylist(pairs), path)
    return path, problems
