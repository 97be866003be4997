"""calc_tool: long-number arithmetic the tiny model cannot do in its head but can with the calculator tool.

| prompt (user turn) | answer |
|--------------------|--------|
| 347 * 86 =         | 29842  |
| 4821 + 7390 =      | 12211  |

Half the problems multiply a 3-digit by a 2-digit number, half add two 4-digit numbers. The response ends
with "answer: N" (the reward, `megarl.rewards.calc_tool`, reads the last one). `make_calc_tool` writes:

  train.parquet, val.parquet   RL prompts in verl's schema: data_source "calc_tool", prompt [{role: user,
                               content}], ability "arithmetic", reward_model {style: rule, ground_truth},
                               extra_info {split, index}.
  sft.parquet                  multi-turn traces in `messages` form (train with data.multiturn.enable=true:
                               every assistant turn is an example). A share `tool_share` call the
                               calculator in the Hermes format, read its result and answer:
                                 assistant  <tool_call>\\n{"name": "calculator", "arguments":
                                            {"expression": "347 * 86"}}\\n</tool_call>
                                 tool       29842
                                 assistant  answer: 29842
                               the rest answer at once ("answer: 29842"), which the tiny model cannot learn:
                               after SFT it calls the tool about tool_share of the time, and RL with the
                               calculator (configs/agentic_grpo.yaml) teaches it to call it more.

Val problems never occur in the other files; everything is reproducible from `seed`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

DATA_SOURCE = "calc_tool"
TOOL = "calculator"


def calc_problem(rng: random.Random) -> tuple[str, str, str]:
    """(prompt, the calculator's expression, the answer)."""
    if rng.random() < 0.5:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        expression, answer = f"{a} * {b}", a * b
    else:
        a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
        expression, answer = f"{a} + {b}", a + b
    return f"{expression} =", expression, str(answer)


def tool_call_text(expression: str) -> str:
    """The assistant turn calling the calculator, in the Hermes format (verl's default)."""
    call = json.dumps({"name": TOOL, "arguments": {"expression": expression}})
    return f"<tool_call>\n{call}\n</tool_call>"


def answer_text(answer: str) -> str:
    return f"answer: {answer}"


def trace(prompt: str, expression: str, answer: str, use_tool: bool) -> list[dict[str, str]]:
    """One SFT conversation: with the tool (call, result, answer) or without (the answer at once)."""
    user = {"role": "user", "content": prompt}
    if not use_tool:
        return [user, {"role": "assistant", "content": answer_text(answer)}]
    return [
        user,
        {"role": "assistant", "content": tool_call_text(expression)},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": answer_text(answer)},
    ]


def make_calc_tool(
    out_dir: str | Path, n_train: int, n_val: int, n_sft: int, seed: int = 0, tool_share: float = 0.5
) -> tuple[Path, Path, Path]:
    """Write train.parquet, val.parquet and sft.parquet (see the module docstring) into `out_dir`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not 0.0 <= tool_share <= 1.0:
        raise ValueError(f"tool_share={tool_share} must be in [0, 1]")
    rng = random.Random(f"{DATA_SOURCE}:{seed}")
    val: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    while len(val) < n_val:
        problem = calc_problem(rng)
        if problem[0] not in seen:
            seen.add(problem[0])
            val.append(problem)
    train = _draw(rng, n_train, seen)
    sft = _draw(rng, n_sft, seen)
    uses = [i < round(tool_share * n_sft) for i in range(n_sft)]
    rng.shuffle(uses)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = tuple(out / f"{split}.parquet" for split in ("train", "val", "sft"))
    pq.write_table(pa.Table.from_pylist(_rl_rows(train, "train")), files[0])
    pq.write_table(pa.Table.from_pylist(_rl_rows(val, "val")), files[1])
    rows = [
        {"messages": trace(p, e, a, use), "data_source": DATA_SOURCE, "uses_tool": use}
        for (p, e, a), use in zip(sft, uses)
    ]
    pq.write_table(pa.Table.from_pylist(rows), files[2])
    return files


def _draw(rng: random.Random, n: int, held_out: set[str]) -> list[tuple[str, str, str]]:
    drawn = []
    while len(drawn) < n:
        problem = calc_problem(rng)
        if problem[0] not in held_out:
            drawn.append(problem)
    return drawn


def _rl_rows(problems: list[tuple[str, str, str]], split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i},
        }
        for i, (prompt, _, answer) in enumerate(problems)
    ]
