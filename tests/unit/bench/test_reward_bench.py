"""`megarl bench reward` on a few rows: its JSON and table have the shape the README promises."""

from __future__ import annotations

import argparse
import json

import pytest

from megarl.bench import reward as bench

pytestmark = pytest.mark.unit


def test_the_reward_bench_writes_json_and_a_table_per_reward(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [
            "--out",
            str(tmp_path),
            "--rows",
            "16",
            "--repeats",
            "1",
            "--workers",
            "1",
            "--rewards",
            "countdown",
            "verl_file",
            "--step-seconds",
            "2.0",
        ]
    )
    result = bench.run(args)
    assert json.loads((tmp_path / "reward.json").read_text()) == result
    assert result["rows"] == 16 and result["cpu"] and result["cores"] >= 1 and result["timeout_s"] == 10.0
    for name, mean in (("countdown", 0.55), ("verl_file", 0.5)):  # right and wrong answers alternate
        r = result["rewards"][name]
        assert r["in_driver"]["workers"] == 0 and r["contained"]["workers"] == 1
        assert r["in_driver"]["mean_reward"] == r["contained"]["mean_reward"] == pytest.approx(mean)
        assert r["ratio"] == pytest.approx(r["contained"]["seconds"] / r["in_driver"]["seconds"])
        assert r["us_per_row"]["contained"] == pytest.approx(r["contained"]["seconds"] / 16 * 1e6)
    lines = (tmp_path / "reward.md").read_text().splitlines()
    assert lines[0].startswith(
        f"# megarl bench reward — the reward stage on 16 rows, median of 1 (CPU: {result['cpu']}"
    )
    assert lines[2].endswith("| worker start s | share of a step |")
    assert [line.split(" | ")[0] for line in lines[4:]] == ["| countdown", "| verl_file"]
    assert lines[4].endswith(f" {result['rewards']['countdown']['contained']['seconds'] / 2.0:.2%} |")
