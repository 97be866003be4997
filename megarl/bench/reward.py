"""`megarl bench reward`: what containing the reward functions costs — the reward stage
(`RewardComputer.score`) on the same rows with the functions in reward worker processes under
`reward.timeout_s` (the default) and called in the driver process (`reward.workers=0`, verl's way).

For each built-in rule reward and a verl-style reward file, 1,024 rows (`--rows`) of realistic responses
are scored `--repeats` times after a warm-up call (which starts the workers: timed apart as
`start_seconds`). Reports the median seconds, µs per row and the contained / in-driver ratio; with
`--step-seconds S` (a step's time, e.g. from `megarl bench e2e`) also the contained stage's share of
it. Writes `<out>/reward.json` and `reward.md`; ratios depend on the CPU, named in both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from megarl.config.schema import RewardFunctionConfig, RewardModelConfig
from megarl.observe.machine import cpu_model

if TYPE_CHECKING:  # torch, tensordict and transformers load when the bench runs, not with the CLI's parser
    from megarl.protocol import Batch
    from megarl.rewards.computer import RewardComputer

VERL_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    answer = solution_str.strip().split()[-1] if solution_str.strip() else ""
    exact = float(answer == ground_truth)
    return {"score": exact, "acc": exact, "chars": float(len(solution_str))}
"""

_THOUGHT = "Let me work through this step by step, checking each number once. " * 6


def _row(reward: str, i: int) -> tuple[str, str, Any]:
    """(data_source, response, ground truth) of row i: right and wrong answers alternate."""
    right = i % 2 == 0
    if reward == "gsm8k":
        return "openai/gsm8k", f"{_THOUGHT}So the total is #### {i if right else i + 1}", str(i)
    if reward == "math":
        return (
            "lighteval/MATH",
            f"{_THOUGHT}The answer is $\\boxed{{\\frac{{{i}}}{{2}}}}$.",
            f"\\frac{{{i if right else 1}}}{{2}}",
        )
    if reward == "countdown":
        answer = "(25 - 5) * 4 + 3" if right else "25 * 4 - 5 + 3"
        truth = {"target": 83, "numbers": [25, 5, 4, 3]}
        return "countdown", f"Assistant: <think>{_THOUGHT}</think> <answer>{answer}</answer>", truth
    if reward == "math_dapo":
        return "aime2024", f"{_THOUGHT}Answer: {i if right else i + 1}", str(i)
    if reward == "search_r1":
        answer = f"The City {i}" if right else "London"
        truth = {"target": [f"city {i}", f"c{i}"]}
        return "searchR1_nq", f"<think>{_THOUGHT}</think><answer>{answer}</answer>", truth
    if reward == "digits":
        return "megarl/digits_sort", "13459" if right else "13495", "13459"
    return "my/private_set", f"{_THOUGHT} {i}", str(i if right else -1)  # the verl file


REWARDS = ("gsm8k", "math", "math_dapo", "search_r1", "countdown", "digits", "verl_file")


def make_batch(reward: str, rows: int) -> Batch:
    import torch

    from megarl.protocol import Batch

    sources, texts, truths = zip(*(_row(reward, i) for i in range(rows)))
    columns = {"data_source": list(sources), "response_text": list(texts), "ground_truth": list(truths)}
    return Batch({"index": torch.arange(rows)}, columns)


def time_scoring(computer: RewardComputer, batch: Batch, repeats: int) -> dict[str, Any]:
    """The first call (starts the workers) and the median of `repeats` more; errors must be 0."""
    import torch

    start = time.perf_counter()
    first_scores, metrics = computer.score(batch)
    first = time.perf_counter() - start
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        scores, metrics = computer.score(batch)
        samples.append(time.perf_counter() - start)
        if metrics.get("reward/errors"):
            raise RuntimeError(f"bench reward: {metrics['reward/errors']:.0f} rows failed")
    assert torch.equal(scores, first_scores)
    return {
        "first_seconds": first,
        "seconds": statistics.median(samples),
        "mean_reward": float(scores.mean()),
    }


def measure(reward: str, rows: int, repeats: int, workers: int | None, directory: Path) -> dict[str, Any]:
    from megarl.rewards.computer import RewardComputer

    function = RewardFunctionConfig()
    if reward == "verl_file":
        path = directory / "verl_reward.py"
        path.write_text(VERL_FILE)
        function = RewardFunctionConfig(path=str(path))
    batch = make_batch(reward, rows)
    sides = {}
    for side, n_workers in (("in_driver", 0), ("contained", workers)):
        computer = RewardComputer(RewardModelConfig(function=function, workers=n_workers), None)
        try:
            sides[side] = time_scoring(computer, batch, repeats)
            sides[side]["workers"] = computer.workers
        finally:
            computer.close()
    if sides["in_driver"]["mean_reward"] != sides["contained"]["mean_reward"]:
        raise RuntimeError(f"bench reward: {reward} scores differ between the driver and the workers")
    contained, in_driver = sides["contained"], sides["in_driver"]
    return {
        **sides,
        "start_seconds": contained["first_seconds"] - contained["seconds"],
        "us_per_row": {side: s["seconds"] / rows * 1e6 for side, s in sides.items()},
        "ratio": contained["seconds"] / in_driver["seconds"],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--workers", type=int, default=None, help="reward.workers (default: reward.workers=None's count)"
    )
    parser.add_argument("--rewards", nargs="+", default=list(REWARDS), choices=REWARDS)
    parser.add_argument("--step-seconds", type=float, default=None, help="a step's seconds: adds the share")


def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "rows": args.rows,
        "repeats": args.repeats,
        "timeout_s": RewardModelConfig().timeout_s,
        "step_seconds": args.step_seconds,
        "rewards": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for reward in args.rewards:
            result["rewards"][reward] = measure(reward, args.rows, args.repeats, args.workers, Path(tmp))
    out = Path(args.out) / "reward.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(table(result))
    return result


def table(result: dict[str, Any]) -> str:
    step = result.get("step_seconds")
    lines = [
        f"# megarl bench reward — the reward stage on {result['rows']} rows, median of {result['repeats']} "
        f"(CPU: {result['cpu']}, {result['cores']} cores; reward.timeout_s={result['timeout_s']:g})",
        "",
        "| reward | in driver ms | contained ms (workers) | µs/row in driver | µs/row contained | contained / in "
        "driver | worker start s |" + (" share of a step |" if step else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if step else ""),
    ]
    for name, r in result["rewards"].items():
        c, d = r["contained"], r["in_driver"]
        share = f" {c['seconds'] / step:.2%} |" if step else ""
        lines.append(
            f"| {name} | {d['seconds'] * 1e3:.1f} | {c['seconds'] * 1e3:.1f} ({c['workers']}) | "
            f"{r['us_per_row']['in_driver']:.1f} | {r['us_per_row']['contained']:.1f} | {r['ratio']:.2f}× | "
            f"{r['start_seconds']:.2f} |" + share
        )
    return "\n".join(lines) + "\n"
