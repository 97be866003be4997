"""The variable-length workload of `megarl bench e2e` (`--workloads variable`).

On the fixed workload the random-weight models run nearly every response to max new tokens, so padding
costs nothing. Here each size's random model is first SFT-warm-started (megarl's own SFT trainer, 2
processes under torchrun; built once per size under `<out>/varlen/<size>`, seed 0) on `count N` → the
digits "1234567890123…" cut to N, then EOS. N follows a long-tailed spread: a log-normal truncated to
1…max_new_tokens−1 (a few tokens to nearly the limit, mean about a third of it, `target_lengths`). The
warm-started model answers `count N` prompts with responses of about N tokens and stops with EOS, so
both sides run their own unmodified generation (vLLM on megarl's side, HF generate on TRL's) from the
same weights on the same prompts, and the lengths they sample follow the same distribution. The reward
is the digit tasks' exact match (`megarl/digits_count`), on both sides. megarl's update is packed (no
padding, `Size.packed`) at every size on this workload: how a user trains variable lengths.

Each side's response lengths (mean, p50, p90: medians over the measured steps of each step's value) are
reported beside the ratio, so a drift of the distribution between the sides or over the steps shows.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from pathlib import Path

from megarl.bench.measure import run_measured, spread

TASK = "megarl/digits_count"
COUNTING = "1234567890"
SIGMA = 0.8  # log-normal spread of the target lengths
MEDIAN_SHARE = 0.28  # the log-normal's median / max_new_tokens: truncated, its mean is about a third
SFT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "quickstart_sft.yaml"
# 150 steps of 32 pairs (lr 2e-3, cosine, 30 warm-up): final loss tiny 0.010, 3m 0.093, 25m 0.078; built in
# 41–62 s (tiny), 124 s (3m), 812 s (25m, 5.4 s/step) on 2 vCPUs (AMD EPYC) shared with other runs (load 6–11)
SFT_STEPS = 150
SFT_BATCH = 32


def target_lengths(n: int, max_new_tokens: int, rng: random.Random) -> list[int]:
    """`n` answer lengths in 1…max_new_tokens−1 (room for EOS): log-normal, median 0.28 × the limit, σ 0.8,
    redrawn when outside (truncated, not clipped: no pile-up at the limit)."""
    top = max_new_tokens - 1
    if top < 2:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a length spread; use ≥ 3")
    mu = math.log(MEDIAN_SHARE * max_new_tokens)
    out: list[int] = []
    while len(out) < n:
        length = round(rng.lognormvariate(mu, SIGMA))
        if 1 <= length <= top:
            out.append(length)
    return out


def count_answer(length: int) -> str:
    """The answer to `count <length>`: 1, 2, …, 9, 0, 1, … (one token per digit), `length` digits."""
    return (COUNTING * (length // len(COUNTING) + 1))[:length]


def make_varlen_task(
    out_dir: Path, max_new_tokens: int, seed: int = 0, n_train: int = 512, n_sft: int = 4096
):
    """train.parquet (verl's RL schema) and sft.parquet (prompt/response) of `count N` under `out_dir`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(f"{TASK}:{max_new_tokens}:{seed}")
    train = target_lengths(n_train, max_new_tokens, rng)
    sft = target_lengths(n_sft, max_new_tokens, rng)
    rows = [
        {
            "data_source": TASK,
            "prompt": [{"role": "user", "content": f"count {n}"}],
            "ability": "digits",
            "reward_model": {"style": "rule", "ground_truth": count_answer(n)},
            "extra_info": {"split": "train", "index": i},
        }
        for i, n in enumerate(train)
    ]
    pairs = [{"prompt": f"count {n}", "response": count_answer(n), "data_source": TASK} for n in sft]
    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out_dir / "train.parquet")
    pq.write_table(pa.Table.from_pylist(pairs), out_dir / "sft.parquet")


def sft_overrides(base: Path, data: Path, out: Path, max_new_tokens: int, seed: int) -> list[str]:
    return [
        f"model.path={base}",
        f"data.train_files=[{data / 'sft.parquet'}]",
        f"data.max_response_length={max_new_tokens}",
        f"data.train_batch_size={SFT_BATCH}",
        f"data.seed={seed}",
        f"actor.micro_batch_size={SFT_BATCH // 2}",
        f"actor.optimizer.lr_warmup_steps={SFT_STEPS // 5}",
        f"trainer.total_steps={SFT_STEPS}",
        f"trainer.output_dir={out}",
        f"trainer.seed={seed}",
        "trainer.launcher=torchrun",
        "logging.backends=[console,jsonl]",
        "logging.report=false",
    ]


def prepare_varlen(
    name: str, base: Path, max_new_tokens: int, root: Path, seed: int = 0
) -> tuple[Path, Path, dict]:
    """(warm-started model dir, train parquet, {"sft_seconds", "cached"}) for size `name`, built once under
    `<root>/varlen/<name>` from its random model `base`; `sft_seconds` is the build's time (kept in
    `built.txt`, so a cached model reports the time it took when it was built)."""
    here = root / "varlen" / name
    data, sft = here / "data", here / "sft"
    model, built = sft / "hf", here / "built.txt"
    if (model / "config.json").exists() and built.exists():
        return model, data / "train.parquet", {"sft_seconds": float(built.read_text()), "cached": True}
    make_varlen_task(data, max_new_tokens, seed)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "megarl.cli", "sft", str(SFT_CONFIG)]
    cmd += sft_overrides(base, data, sft, max_new_tokens, seed)
    run_measured(cmd, here / "sft.log")  # bounded; a failure raises naming the log, nothing left running
    seconds = time.perf_counter() - start
    built.write_text(f"{seconds:.1f}")
    return model, data / "train.parquet", {"sft_seconds": seconds, "cached": False}


def length_stats(lengths: list[int]) -> dict[str, float]:
    """mean, p50, p90 of one step's response lengths (the lower of the two nearest, as torch.quantile's
    interpolation="lower" in megarl's response_length/p50, /p90)."""
    ordered = sorted(lengths)
    rank = lambda q: ordered[math.floor(q * (len(ordered) - 1))]  # noqa: E731
    return {"mean": statistics.fmean(ordered), "p50": float(rank(0.5)), "p90": float(rank(0.9))}


def target_stats(data: Path, prompts: int, group: int, warmup: int, steps: int) -> dict[str, float]:
    """What the sides' response lengths should be if neither drifts from the warm-started model: each
    measured step's target lengths N + 1 (the answer and its EOS, `group` responses per prompt) through
    `length_stats`, medians over the steps (as `side_lengths` reads the sides)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(data).to_pylist()
    per_step = [
        length_stats(
            [len(r["reward_model"]["ground_truth"]) + 1 for r in rows[i * prompts : (i + 1) * prompts]]
            * group
        )
        for i in range(warmup, warmup + steps)
    ]
    return {k: statistics.median(s[k] for s in per_step) for k in ("mean", "p50", "p90")}


def side_lengths(steps: list[dict]) -> dict[str, dict] | None:
    """Each of mean/p50/p90 over a side's measured steps (median, min–max); None without lengths."""
    rows = [s["response_length"] for s in steps if s.get("response_length")]
    return {k: spread([r[k] for r in rows]) for k in ("mean", "p50", "p90")} if rows else None


def lengths_text(stats: dict | None) -> str:
    if not stats:
        return "–"
    return " / ".join(f"{stats[k]['median']:.0f}" for k in ("mean", "p50", "p90")) + (
        f" (mean {stats['mean']['min']:.0f}–{stats['mean']['max']:.0f})"
    )


def workloads_table(result: dict) -> list[str]:
    """The per-size summary: megarl/TRL tok/s on each workload, the variable one's response lengths."""
    lines = [
        "| size | fixed megarl/TRL tok/s | variable megarl/TRL tok/s | variable: megarl length mean / p50 / p90 "
        "| variable: TRL length mean / p50 / p90 | target N + 1 mean / p50 / p90 | SFT warm start s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in result["sizes"].items():
        v = e.get("variable", {})
        fixed = f"**{e['ratio_tokens_per_s']:.2f}×**" if "ratio_tokens_per_s" in e else "–"
        var = f"**{v['ratio_tokens_per_s']:.2f}×**" if "ratio_tokens_per_s" in v else "–"
        m = lengths_text(v["megarl"]["summary"].get("response_length")) if "megarl" in v else "–"
        t = lengths_text(v["trl"]["summary"].get("response_length")) if "trl" in v else "–"
        sft = f"{v['sft_seconds']:.0f}" if "sft_seconds" in v else "–"
        target = (
            " / ".join(f"{v['target_length'][k]:.0f}" for k in ("mean", "p50", "p90"))
            if "target_length" in v
            else "–"
        )
        lines.append(
            f"| {name} (max {e['size']['new_tokens']} new) | {fixed} | {var} | {m} | {t} | {target} | {sft} |"
        )
    return lines
