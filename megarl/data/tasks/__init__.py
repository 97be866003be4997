"""Locally generated verifiable tasks (`megarl data make TASK --out DIR`), written in verl's schema.

`make_task(name, out_dir)` writes five parquet files:

  train.parquet, val.parquet   RL prompts: data_source "megarl/<name>", prompt [{role: user, content}],
                               ability "digits", reward_model {style: rule, ground_truth}, extra_info
                               {split, index}. Scored by `megarl.rewards` (exact match; reward = accuracy).
  sft.parquet                  warm-start pairs: prompt (the user text, a string), response (the answer,
                               no EOS: the SFT loader appends it), messages (user + assistant turns),
                               data_source. A string prompt renders to the same tokens as the RL chat list.
  preference.parquet           DPO-style pairs: prompt (the user text), chosen (the answer), rejected (a
                               plausible wrong answer: the prompt's digits copied unchanged for list tasks,
                               the sum off by 1-9 for digits_add), data_source.
  kto.parquet                  KTO rows: prompt, completion, label (true: the answer, false: the wrong
                               answer above; exactly half true, in random order), data_source.

Problems whose copied digits are the answer (a palindrome reversed, sorted digits sorted) are left out of
the preference and KTO files: there the wrong answer would be right.

Val problems never occur in the other files; everything is reproducible from `seed`.

`calc_tool` (megarl.data.tasks.calc_tool) is the tool-calling task: train, val and a multi-turn SFT file
of calculator traces, no preference or KTO file.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megarl.data.tasks.calc_tool import DATA_SOURCE as CALC_TOOL
from megarl.data.tasks.calc_tool import make_calc_tool
from megarl.data.tasks.digits import GENERATORS, Problem

DIGIT_TASKS = sorted(GENERATORS)
TASKS = sorted([*DIGIT_TASKS, CALC_TOOL])
COPYABLE = ("digits_reverse", "digits_sort")  # tasks whose prompt ends with the digit list to transform


def _copied(prompt: str) -> str:
    """The wrong answer of a noisy warm-start pair: the prompt's digit list unchanged."""
    return prompt.split()[-1]


def _wrong(name: str, prompt: str, answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: the digits copied (list tasks; equal to the answer for palindromes and
    sorted lists, which the caller skips) or a sum off by 1-9, never negative."""
    if name in COPYABLE:
        return _copied(prompt)
    total, off = int(answer), rng.randint(1, 9)
    return str(total - off if off <= total and rng.random() < 0.5 else total + off)


@dataclass(frozen=True)
class TaskFiles:
    train: Path
    val: Path
    sft: Path
    preference: Path | None  # None: the task has no preference pairs (calc_tool)
    kto: Path | None


def make_task(
    name: str,
    out_dir: str | Path,
    n_train: int = 2048,
    n_val: int = 128,
    n_sft: int = 2048,
    seed: int = 0,
    n_pref: int = 1024,
    sft_noise: float = 0.0,
    tool_share: float | None = None,
) -> TaskFiles:
    """Generate task `name` (one of `TASKS`) into `out_dir`; returns the five file paths. The preference
    and KTO files hold `n_pref` rows each.

    `sft_noise` is the fraction of warm-start pairs whose response is wrong in a plausible way: the
    prompt's digits copied unchanged (list tasks only). A model fine-tuned on them answers right only
    part of the time, which is the imperfect starting point RL with a verifiable reward improves on.
    `tool_share` (calc_tool only; None = 0.5) is the share of SFT traces that call the calculator.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; use one of {', '.join(TASKS)}")
    for key, n in (("n_train", n_train), ("n_val", n_val), ("n_sft", n_sft), ("n_pref", n_pref)):
        if n < 1:
            raise ValueError(f"{key}={n} must be ≥ 1")
    if name == CALC_TOOL:
        if sft_noise:
            raise ValueError(f"sft_noise needs a list task ({', '.join(COPYABLE)}), not {name!r}")
        share = 0.5 if tool_share is None else tool_share
        train_file, val_file, sft_file = make_calc_tool(out_dir, n_train, n_val, n_sft, seed, share)
        return TaskFiles(train_file, val_file, sft_file, None, None)
    if tool_share is not None:
        raise ValueError(f"tool_share is a setting of {CALC_TOOL}, not of {name!r}")
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
    # drawn after everything above, so train, val and sft do not depend on n_pref
    drawn = (generate(rng) for _ in range(n_pref * 4))
    triples = [(prompt, answer, _wrong(name, prompt, answer, rng)) for prompt, answer in drawn]
    pref = [t for t in triples if t[0] not in held_out and t[1] != t[2]][:n_pref]
    if len(pref) < n_pref:
        raise ValueError(f"{name} has too few distinct problems for n_val={n_val}; lower n_val")
    labels = [i % 2 == 0 for i in range(n_pref)]
    rng.shuffle(labels)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = TaskFiles(*(out / f"{split}.parquet" for split in ("train", "val", "sft", "preference", "kto")))
    source = f"megarl/{name}"
    pq.write_table(pa.Table.from_pylist(_rl_rows(train, source, "train")), files.train)
    pq.write_table(pa.Table.from_pylist(_rl_rows(val, source, "val")), files.val)
    pq.write_table(pa.Table.from_pylist(_sft_rows(sft, source)), files.sft)
    pairs = [{"prompt": p, "chosen": a, "rejected": w, "data_source": source} for p, a, w in pref]
    pq.write_table(pa.Table.from_pylist(pairs), files.preference)
    kto = [
        {"prompt": p, "completion": a if good else w, "label": good, "data_source": source}
        for (p, a, w), good in zip(pref, labels)
    ]
    pq.write_table(pa.Table.from_pylist(kto), files.kto)
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
