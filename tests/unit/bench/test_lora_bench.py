"""`megarl bench lora`: the command parses, and its ratios and table from hand-made per-rank numbers."""

from __future__ import annotations

import pytest

from megarl.bench import lora as bench
from megarl.bench.measure import spread
from megarl.cli import build_parser
from megarl.cli.bench import bench_suite

pytestmark = pytest.mark.unit

MIB = 2**20


def _side(seconds: list[float], trainable: int, optimizer_mib: int, peak_mib: int, with_ref_mib: int) -> dict:
    memory = {"method": "VmHWM after clear_refs", "built_bytes": 0}
    return {
        "seconds": seconds,
        "params": 1000,
        "trainable_params": trainable,
        "weights_bytes": 4 * MIB,
        "reference_weights_bytes": 4 * MIB if trainable == 1000 else 0,
        "state_bytes": {"grads": optimizer_mib * MIB // 2, "optimizer": optimizer_mib * MIB},
        "memory": {**memory, "peak_bytes": peak_mib * MIB},
        "memory_with_reference": {**memory, "peak_bytes": with_ref_mib * MIB},
        "threads": 2,
    }


def _case(mib: float, seconds: list[float]) -> dict:
    numbers = {"engine_bytes": int(mib * MIB), "received_bytes": 0, "floor_bytes": 0, "tensors": 3}
    first = {**numbers, "seconds": 0.5, "phase_seconds": {}}
    return {**numbers, "seconds": spread(seconds), "phase_seconds": {}, "first": first}


def _rank(full_seconds: list[float]) -> dict:
    return {
        "full": _side(full_seconds, 1000, 8, 40, 60),
        "lora": _side([1.0, 1.0, 2.0], 100, 1, 20, 21),
        "sync": {
            "full": _case(4, [0.1, 0.2, 0.3]),
            "merged": _case(3, [0.1, 0.15, 0.2]),
            "adapter": _case(0.5, [0.01, 0.02, 0.03]),
        },
    }


def test_bench_lora_parses_with_its_defaults():
    args = build_parser().parse_args(["bench", "lora"])
    assert args.func is bench_suite and args.what == "lora"
    assert args.sizes == ["3m"] and args.rank == 16 and args.targets == ["all-linear"]
    assert (args.tp, args.pp, args.gen_tp, args.repeats) == (1, 1, 1, 5)


def test_the_ratios_are_lora_over_full_at_the_slowest_and_largest_rank():
    s = bench.summarize([_rank([2.0, 2.0, 3.0]), _rank([4.0, 4.0, 1.0])], tokens=1000)
    assert s["full"]["update_seconds"] == 4.0 and s["lora"]["update_seconds"] == 1.0  # the slowest rank
    assert s["ratio"]["tokens_per_s"] == pytest.approx(4.0)
    assert s["ratio"]["fastest_tokens_per_s"] == pytest.approx(
        2.0
    )  # 2.0 s (the slower rank's fastest) over 1.0
    assert s["ratio"]["trainable_params"] == pytest.approx(0.1)
    assert s["ratio"]["optimizer_bytes"] == pytest.approx(1 / 8)
    assert s["ratio"]["peak_bytes"] == pytest.approx(0.5)
    assert s["ratio"]["peak_with_reference_bytes"] == pytest.approx(21 / 60)
    # held: weights 4 + grads + optimizer (full 4 + 8, LoRA 0.5 + 1); full training adds a reference copy (4)
    assert s["full"]["held_bytes"] == 16 * MIB and s["lora"]["held_bytes"] == 5.5 * MIB
    assert s["ratio"]["held_with_reference_bytes"] == pytest.approx(5.5 / 20)


def test_the_table_gives_the_ratios_and_each_engine_ranks_sync_cases():
    ranks = [_rank([2.0, 2.0, 3.0])]
    entry = {
        "params": 3_500_000,
        "cpu": "AMD EPYC",
        "device": "cpu",
        "rank": 16,
        "alpha": 32.0,
        "targets": ["all-linear"],
        "tp": 1,
        "pp": 1,
        "gen_tp": 1,
        "threads": 2,
        "dtype": "fp32",
        "sequences": 32,
        "prompt_len": 32,
        "response_len": 96,
        "tokens": 4096,
        "warmup": 1,
        "repeats": 3,
        "ranks": ranks,
        "summary": bench.summarize(ranks, 4096),
    }
    text = bench.table({"sizes": {"3m": entry}})
    assert "## 3m (3.50M), LoRA r16 α32 on all-linear; TP 1 × PP 1, generation TP 1; cpu, AMD EPYC" in text
    assert "| update s, median (min–max) | 2.000 (2.000–3.000) | 1.000 (1.000–2.000) | **0.500** |" in text
    assert "| update tokens/s, median | 2,048 | 4,096 | **2.000** |" in text
    assert "| optimizer state MiB | 8.00 | 1.00 | **0.125** |" in text
    assert "| weights + gradients + optimizer state MiB | 16.00 | 5.50 | **0.344** |" in text
    assert "| the same + the reference's weights MiB | 20.00 | 5.50 | **0.275** |" in text
    assert "| peak memory MiB, actor | 40.00 | 20.00 | **0.500** |" in text
    assert "adapters off) | 60.00 | 21.00 | **0.350** |" in text
    assert "| 0 | full | every weight (base Resharder) | 4.00 | 0.00 (0.00) | 0.2000 (0.1000–0.3000) " in text
    assert "| 0 | adapter | the adapter tensors (load_adapter) | 0.50 |" in text
    assert "| **0.125** | **0.100** | 0.50, 0.500 |" in text  # bytes and seconds over full's; the first sync
