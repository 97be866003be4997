"""The variable-length workload of `megarl bench e2e`: its length spread, its data and its tables."""

from __future__ import annotations

import random
import statistics

import pyarrow.parquet as pq
import pytest
import torch

from megarl.bench.e2e import SIZES, STAGES, merge_rounds, summarize_side, table
from megarl.bench.varlen import count_answer, length_stats, make_varlen_task, target_lengths, target_stats


@pytest.mark.parametrize("limit", [32, 64, 128])
def test_the_target_lengths_are_long_tailed_with_a_mean_about_a_third_of_the_limit(limit):
    lengths = sorted(target_lengths(4096, limit, random.Random(0)))
    assert lengths == sorted(target_lengths(4096, limit, random.Random(0)))  # reproducible
    assert 1 <= lengths[0] <= 3 and 0.85 * limit <= lengths[-1] <= limit - 1  # a few tokens to ~the limit
    assert 0.29 <= statistics.mean(lengths) / limit <= 0.36
    p50, p90 = lengths[len(lengths) // 2], lengths[int(0.9 * len(lengths))]
    assert p90 >= 2.2 * p50  # long-tailed: the mean is above the median
    assert statistics.mean(lengths) > p50
    assert lengths.count(limit - 1) < 0.01 * len(lengths)  # truncated, not clipped: no pile-up at the limit


def test_each_answer_is_its_length_in_tokens_and_scores_under_the_digit_rule(tmp_path):
    from megarl.models.tiny import build_tokenizer
    from megarl.rewards import default_compute_score

    tokenizer = build_tokenizer(512)
    for n in (1, 9, 10, 11, 37, 127):
        assert len(tokenizer(count_answer(n), add_special_tokens=False)["input_ids"]) == n
    assert count_answer(12) == "123456789012"
    make_varlen_task(tmp_path, 64, n_train=16, n_sft=32)
    rows = pq.read_table(tmp_path / "train.parquet").to_pylist()
    pairs = pq.read_table(tmp_path / "sft.parquet").to_pylist()
    assert len(rows) == 16 and len(pairs) == 32
    for row in rows:
        n = int(row["prompt"][0]["content"].split()[-1])
        truth = row["reward_model"]["ground_truth"]
        assert truth == count_answer(n) and 1 <= n <= 63
        assert default_compute_score(row["data_source"], truth, truth) == 1.0
        assert default_compute_score(row["data_source"], truth + "1", truth) == 0.0
    assert all(p["response"] == count_answer(int(p["prompt"].split()[-1])) for p in pairs)
    steps = [[len(r["reward_model"]["ground_truth"]) + 1 for r in rows[i : i + 4]] * 2 for i in (4, 8)]
    expected = {k: statistics.median(length_stats(s)[k] for s in steps) for k in ("mean", "p50", "p90")}
    assert target_stats(tmp_path / "train.parquet", 4, 2, 1, 2) == expected  # 1 warm-up, 2 steps of 4 × 2


def test_the_length_percentiles_match_the_trainers_response_length_metrics():
    lengths = [5, 1, 9, 30, 2, 7, 64, 3, 11, 4]
    t = torch.tensor(lengths, dtype=torch.float32)
    assert length_stats(lengths) == {
        "mean": pytest.approx(t.mean().item()),
        "p50": t.quantile(0.5, interpolation="lower").item(),
        "p90": t.quantile(0.9, interpolation="lower").item(),
    }


def _side(seconds: list[float], tokens: int, means: list[float]) -> dict:
    steps = [
        {
            "step_seconds": s,
            "completion_tokens": tokens,
            **{k: s / len(STAGES) for k in STAGES},
            "response_length": {"mean": m, "p50": m - 4, "p90": 2 * m},
        }
        for s, m in zip(seconds, means)
    ]
    return merge_rounds([{"steps": steps, "peak_rss_bytes": 512 * 2**20, "wall_seconds": sum(seconds)}])


def test_the_table_puts_the_variable_ratio_and_both_sides_lengths_beside_the_fixed_ratio():
    fixed = {side: _side([1.0], 1000, [31.0]) for side in ("megarl", "trl")}
    variable = {"megarl": _side([1.0, 1.0], 400, [12.0, 14.0]), "trl": _side([4.0], 400, [13.0])}
    m = summarize_side(variable["megarl"])
    assert m["response_length"]["mean"] == {"median": 13.0, "min": 12.0, "max": 14.0, "n": 2}
    entry = {
        "params": 850_000,
        "cpu": "AMD EPYC",
        "size": SIZES["tiny"].__dict__,
        **{side: {"raw": raw, "summary": summarize_side(raw)} for side, raw in fixed.items()},
        "ratio_tokens_per_s": 1.5,
        "variable": {
            **{side: {"raw": raw, "summary": summarize_side(raw)} for side, raw in variable.items()},
            "ratio_tokens_per_s": 4.0,
            "sft_seconds": 42.0,
            "target_length": {"mean": 13.2, "p50": 9.0, "p90": 27.0},
        },
    }
    text = table({"cores": 2, "warmup": 1, "rounds": 2, "sizes": {"tiny": entry}})
    assert "| tiny (0.85M, 8×4×32) | variable | megarl | 400 (400–400) |" in text
    assert "| 512 | 2 (1) | **4.00×** |" in text
    assert (
        "| tiny (max 32 new) | **1.50×** | **4.00×** | 13 / 9 / 26 (mean 12–14) | 13 / 9 / 26 (mean 13–13) "
        "| 13 / 9 / 27 | 42 |" in text
    )
    assert "CPU: AMD EPYC" in text
