"""Locally generated verifiable tasks (`megarl data make TASK --out DIR`), written in verl's schema.

`make_task(name, out_dir)` writes three parquet files:

  train.parquet, val.parquet   RL prompts: data_source "megarl/<name>", prompt [{role: user, content}],
                               ability "digits", reward_model {style: rule, ground_truth}, extra_info
                               {split, index}. Scored by `megarl.rewards` (exact match; reward = accuracy).
  sft.parquet                  warm-start pairs: prompt (the user text, a string), response (the answer,
                               no EOS: the SFT loader appends it), messages (user + assistant turns),
                               data_source. A string prompt renders to the same tokens as the RL chat list.

Val problems never occur in train or sft; everything is reproducible from `seed`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megarl.data.tasks.digits import GENERATORS, Problem

TASKS = sorted(GENERATORS)
COPYABLE = ("digits_reverse", "digits_sort")  # tasks whose prompt ends with the digit list to transform


def _copied(prompt: str) -> str:
    """The wrong answer of a noisy warm-start pair: the prompt's digit list unchanged."""
    return prompt.split()[-1]


@dataclass(frozen=True)
class TaskFiles:
    train: Path
    val: Path
    sft: Path


def make_task(
    name: str,
    out_dir: str | Path,
    n_train: int = 2048,
    n_val: int = 128,
    n_sft: int = 2048,
    seed: int = 0,
    sft_noise: float = 0.0,
) -> TaskFiles:
    """Generate task `name` (one of `TASKS`) into `out_dir`; returns the three file paths.

    `sft_noise` is the fraction of warm-start pairs whose response is wrong in a plausible way: the
    prompt's digits copied unchanged (list tasks only). A model fine-tuned on them answers right only
    part of the time, which is the imperfect starting point RL with a verifiable reward improves on.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if name not in GENERATORS:
        raise ValueError(f"unknown task {name!r}; use one of {', '.join(TASKS)}")
    for key, n in (("n_train", n_train), ("n_val", n_val), ("n_sft", n_sft)):
        if n < 1:
            raise ValueError(f"{key}={n} must be ≥ 1")
    generate = GENERATORS[name]
    rng = random.Random(f"{name}:{seed}")
    val = _unique(generate, rng, n_val, exclude=set())
    held_out = {prompt for prompt, _ in val}
    train = [generate(rng) for _ in range(n_train * 4)]
    train = [p for p in train if p[0] not in held_out][:n_train]
    sft = [p for p in (generate(rng) for _ in range(n_sft * 4)) if p[0] not in held_out][:n_sft]
    if len(train) < n_train or len(sft) < n_sft:
        raise ValueError(f"{name} has too few distinct problems for n_val={n_val}; lower n_val")
    if not 0.0 <= sft_noise <= 1.0:
        raise ValueError(f"sft_noise={sft_noise} must be in [0, 1]")
    if sft_noise and name not in COPYABLE:
        raise ValueError(f"sft_noise needs a list task ({', '.join(COPYABLE)}), not {name!r}")
    sft = [(prompt, _copied(prompt) if rng.random() < sft_noise else answer) for prompt, answer in sft]

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = TaskFiles(out / "train.parquet", out / "val.parquet", out / "sft.parquet")
    source = f"megarl/{name}"
    pq.write_table(pa.Table.from_pylist(_rl_rows(train, source, "train")), files.train)
    pq.write_table(pa.Table.from_pylist(_rl_rows(val, source, "val")), files.val)
    pq.write_table(pa.Table.from_pylist(_sft_rows(sft, source)), files.sft)
    return files


def _unique(generate: Any, rng: random.Random, n: int, exclude: set[str]) -> list[Problem]:
    seen, problems = set(exclude), []
    for _ in range(n * 50):
        prompt, answer = generate(rng)
        if prompt not in seen:
            seen.add(prompt)
            problems.append((prompt, answer))
            if len(problems) == n:
                return problems
    raise ValueError(f"could not draw {n} distinct problems; lower the count")


def _rl_rows(problems: list[Problem], source: str, split: str) -> list[dict[str, Any]]:
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "digits",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": i},
        }
        for i, (prompt, answer) in enumerate(problems)
    ]


def _sft_rows(problems: list[Problem], source: str) -> list[dict[str, Any]]:
    return [
        {
            "prompt": prompt,
            "response": answer,
            "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
            "data_source": source,
        }
        for prompt, answer in problems
    ]
