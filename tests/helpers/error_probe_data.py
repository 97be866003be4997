"""The error probe's cases of what a run reads: data files and reward files (D, R)."""

from __future__ import annotations

import json

from tests.helpers.error_probe import (
    PREFERENCE,
    SFT,
    Case,
    Workspace,
    reward_file_case,
)


def _data(ws: Workspace, name: str, content: str | bytes, *more: str) -> list[str]:
    return ws.train(f"data.train_files=[{ws.file(name, content)}]", *more)


def _rows(ws: Workspace, name: str, rows: list[dict], *more: str) -> list[str]:
    return ws.train(f"data.train_files=[{ws.parquet(name, rows)}]", *more)


def _row(prompt: object, **extra: object) -> dict:
    row = {
        "data_source": "digits_sort",
        "prompt": prompt,
        "reward_model": {"style": "rule", "ground_truth": "123"},
    }
    return {**row, **extra}


def _pandas_json(ws: Workspace) -> list[str]:
    """What `DataFrame.to_json("train.json")` writes by default: one object of columns, not rows."""
    prompt = [{"role": "user", "content": "sort 3 1 2"}]
    columns = {"data_source": {"0": "digits_sort"}, "prompt": {"0": prompt}, "reward_model": {"0": {}}}
    return _data(ws, "train.json", json.dumps(columns))


def _digits_rows(n: int = 16, **extra: object) -> list[dict]:
    return [_row([{"role": "user", "content": "sort 3 1 2"}], **extra)] * n


DATA_CASES: list[Case] = [
    # --- data files (`megarl train` reads them before any worker starts) ---
    Case(
        "D01",
        "data",
        "a train file that does not exist",
        lambda ws: ws.train(f"data.train_files=[{ws.case_dir / 'trian.parquet'}]"),
        ("data.train_files[0]=<case>/trian.parquet does not exist",),
        2,
    ),
    Case(
        "D02",
        "data",
        "an empty .jsonl",
        lambda ws: _data(ws, "train.jsonl", ""),
        ("data.train_files: no rows in <case>/train.jsonl",),
        2,
    ),
    Case(
        "D03",
        "data",
        "a parquet with no rows",
        lambda ws: _rows(ws, "train.parquet", []),
        ("data.train_files: no rows in <case>/train.parquet",),
        2,
    ),
    Case(
        "D04",
        "data",
        "a parquet without the prompt column (`question`)",
        lambda ws: _rows(ws, "train.parquet", [{"question": "sort 3 1 2", "answer": "123"}] * 4),
        ("4 rows: no 'prompt' field (train.parquet row 0", "set data.prompt_key"),
        2,
    ),
    Case(
        "D05",
        "data",
        "`data.prompt_key` naming a missing column",
        lambda ws: ws.train("data.prompt_key=question"),
        ("16 rows: no 'question' field",),
        2,
    ),
    Case(
        "D06",
        "data",
        "a prompt that is a number, not a chat list or a string",
        lambda ws: _rows(ws, "train.parquet", [_row(7)] * 4),
        ("prompt is int, expected a chat list of {role, content} or a string",),
        2,
    ),
    Case(
        "D07",
        "data",
        "a chat list whose messages lack `content`",
        lambda ws: _rows(ws, "train.parquet", [_row([{"role": "user", "text": "hi"}])] * 4),
        ("message 0 has no string 'content' (train.parquet row 0",),
        2,
    ),
    Case(
        "D08",
        "data",
        "a .jsonl with one bad line (line 3), leaving too few rows",
        lambda ws: _data(
            ws,
            "train.jsonl",
            "\n".join(
                [json.dumps(_digits_rows(1)[0])] * 2 + ["{not json"] + [json.dumps(_digits_rows(1)[0])] * 2
            )
            + "\n",
        ),
        (
            "skipped 1 malformed of 5 rows: not valid JSON",
            "train.jsonl line 3",
            "the dataset has 4 usable prompts, fewer than data.train_batch_size=16",
        ),
        2,
    ),
    Case(
        "D09",
        "data",
        "a .jsonl where every line is bad",
        lambda ws: _data(ws, "train.jsonl", "a\nb\n"),
        ("2 rows: not valid JSON (Expecting value) (train.jsonl line 1, train.jsonl line 2)",),
        2,
    ),
    Case(
        "D10",
        "data",
        "a zip file named train.parquet",
        lambda ws: _data(ws, "train.parquet", b"PK\x03\x04" + bytes(200)),
        ("<case>/train.parquet could not be read (ArrowInvalid", "it is not parquet: re-export the data set"),
        2,
    ),
    Case(
        "D11",
        "data",
        "binary bytes named train.jsonl",
        lambda ws: _data(ws, "train.jsonl", bytes(range(256)) * 4),
        ("<case>/train.jsonl could not be read (UnicodeDecodeError", "it is not UTF-8 JSON text"),
        2,
    ),
    Case(
        "D12",
        "data",
        "a .csv file",
        lambda ws: ws.train(f"data.train_files=[{ws.file('train.csv', 'prompt,answer')}]"),
        ("train.csv has an unsupported format; use a .parquet, .jsonl, .json file",),
        2,
    ),
    Case(
        "D13",
        "data",
        "a .json of columns (pandas `to_json()`'s default), not rows",
        _pandas_json,
        ("<case>/train.json holds one JSON object of columns", "orient='records', lines=True"),
        2,
    ),
    Case(
        "D14",
        "data",
        "every prompt longer than data.max_prompt_length",
        lambda ws: ws.train("data.max_prompt_length=4", "data.max_response_length=8"),
        (
            "16 prompts longer than data.max_prompt_length=4 tokens (longest 20)",
            "raise data.max_prompt_length to at least 20",
        ),
        2,
    ),
    Case(
        "D15",
        "data",
        "an unknown data_source (no reward for it)",
        lambda ws: _rows(ws, "train.parquet", _digits_rows(data_source="my_task")),
        ("no reward for data_source 'my_task' (data.train_files)", "set reward.function.path="),
        2,
    ),
    Case(
        "D16",
        "data",
        "a val file without the prompt column",
        lambda ws: ws.train(f"data.val_files=[{ws.parquet('val.parquet', [{'question': 'q'}])}]"),
        ("data.val_files: no usable prompt in <case>/val.parquet",),
        2,
    ),
    Case(
        "D17",
        "data",
        "fewer rows than data.train_batch_size",
        lambda ws: ws.train("data.train_batch_size=32", "algorithm.ppo_mini_batch_size=32"),
        ("the dataset has 16 usable prompts, fewer than data.train_batch_size=32",),
        2,
    ),
    Case(
        "D18",
        "data",
        "`megarl sft` on rows without a response column",
        lambda ws: [
            "sft",
            SFT,
            *ws.base(),
            f"data.train_files=[{ws.parquet('sft.parquet', [{'prompt': 'sort 3 1 2', 'answer': '123'}] * 8)}]",
        ],
        (
            "no usable SFT rows in <case>/sft.parquet",
            "sft.parquet row 0: no column 'response' (data.response_key=response); the columns present: prompt, answer",
        ),
        2,
    ),
    Case(
        "D19",
        "data",
        "`megarl dpo` on pairs without a `chosen` column",
        lambda ws: [
            "dpo",
            PREFERENCE,
            *ws.base(),
            f"data.train_files=[{ws.parquet('pairs.parquet', [{'prompt': 'p', 'good': 'a', 'rejected': 'b'}] * 8)}]",
        ],
        (
            "pairs.parquet row 0: needs `chosen` and `rejected` columns (missing chosen)",
            "no usable preference pairs",
        ),
        2,
    ),
    # --- reward functions (as on main; a reward-file signature check being added may reword R02-R05) ---
    Case(
        "R01",
        "reward",
        "reward.function.path mistyped",
        lambda ws: ws.train(f"reward.function.path={ws.case_dir / 'my_rewrd.py'}"),
        ("reward.function.path=<case>/my_rewrd.py does not exist",),
        2,
    ),
    Case(
        "R02",
        "reward",
        "a reward file with a syntax error",
        lambda ws: reward_file_case(
            ws,
            "def compute_score(data_source, solution_str, ground_truth, extra_info=None)\n    return 1.0\n",
        ),
        ("failed to import: SyntaxError: expected ':' (my_reward.py, line 1); fix the file",),
        2,
    ),
    Case(
        "R03",
        "reward",
        "reward.function.name naming no function in the file",
        lambda ws: reward_file_case(
            ws, "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
        ),
        (
            "has no reward function 'compute_score': it does not define it; set reward.function.name to one of its functions: score",
        ),
        2,
    ),
    Case(
        "R04",
        "reward",
        "a reward file importing a module that is not installed",
        lambda ws: reward_file_case(
            ws, "import math_verify_nope\n\ndef compute_score(*a, **k):\n    return 1.0\n"
        ),
        ("failed to import: ModuleNotFoundError: No module named 'math_verify_nope'",),
        2,
    ),
    Case(
        "R05",
        "reward",
        "a reward file that raises at import",
        lambda ws: reward_file_case(ws, "raise RuntimeError('no API key')\n"),
        ("failed to import: RuntimeError: no API key; fix the file",),
        2,
    ),
]
