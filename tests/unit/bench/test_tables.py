"""The e2e and scaling suites' arithmetic and tables, on hand-made results."""

from __future__ import annotations

import pytest

from megarl.bench.e2e import SIZES, STAGES, launch_order, merge_rounds, summarize_side, table
from megarl.bench.scaling import AXES, fit_exponent, points


def _side(seconds: list[float], tokens: int) -> dict:
    steps = [
        {"step_seconds": s, "completion_tokens": tokens, **{k: s / len(STAGES) for k in STAGES}}
        for s in seconds
    ]
    return {"steps": steps, "peak_rss_bytes": 512 * 2**20, "wall_seconds": sum(seconds)}


def test_the_e2e_table_gives_medians_spreads_and_the_ratio():
    top = {"megarl.train#1": 600 * 2**20, "megarl.train#2": 400 * 2**20}
    megarl = merge_rounds(
        [
            {**_side([1.0, 2.0], 1000), "peak_by_process": {"megarl.train#1": 2**30}},
            {**_side([4.0], 1000), "peak_rss_bytes": 1024 * 2**20, "peak_by_process": top},
        ]
    )
    trl = merge_rounds([_side([4.0, 5.0, 6.0], 1000)])
    assert megarl["launches"] == 2 and megarl["wall_seconds"] == [3.0, 4.0]
    m, t = summarize_side(megarl), summarize_side(trl)
    assert m["tokens_per_s"] == {"median": 500.0, "min": 250.0, "max": 1000.0, "n": 3}
    assert m["peak_rss_mib"] == 1024  # the largest of the launches
    assert m["peak_by_process_mib"] == {"megarl.train#1": 600, "megarl.train#2": 400}  # that launch's
    result = {
        "cores": 2,
        "warmup": 1,
        "rounds": 2,
        "sizes": {
            "tiny": {
                "params": 850_000,
                "cpu": "AMD EPYC",
                "gemm": "openblas",
                "size": SIZES["tiny"].__dict__,
                "megarl": {"raw": megarl, "summary": m},
                "trl": {"raw": trl, "summary": t},
                "ratio_tokens_per_s": 500.0 / 200.0,
                "ratio_peak_memory": 1024 / 512,
            }
        },
    }
    text = table(result)
    assert "| tiny (0.85M, 8×4×32) | fixed | megarl | 500 (250–1000) | 2.00 (1.00–4.00) |" in text
    assert "| 1024 | 3 (2) | **2.50×** | **2.00** |" in text
    assert "- tiny fixed megarl: megarl.train#1 600, megarl.train#2 400" in text
    assert "| tiny (0.85M, 8×4×32) | fixed | trl | 200 (167–250) | 5.00 (4.00–6.00) |" in text
    assert "CPU: AMD EPYC; megarl's linear layers multiply with openblas" in text  # ratios depend on both


def test_the_sides_alternate_so_a_drift_weighs_on_both():
    assert launch_order(["megarl", "trl"], 3) == ["megarl", "trl", "trl", "megarl", "megarl", "trl"]
    assert launch_order(["megarl"], 2) == ["megarl", "megarl"]


def test_the_fitted_exponent_of_a_power_law_is_its_power():
    xs = [8, 16, 32, 64]
    assert fit_exponent(xs, [3 * x**0.5 for x in xs]) == pytest.approx(0.5, abs=1e-12)
    assert fit_exponent(xs, [7.0] * 4) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("axis", list(AXES))
def test_each_scaling_axis_changes_only_its_own_quantity(axis):
    sizes = [size for _, size in points(axis)]
    moved = {
        "model_params": lambda s: s.model,
        "prompts": lambda s: s.prompts,
        "new_tokens": lambda s: s.new_tokens,
    }
    for key, get in moved.items():
        values = {repr(get(s)) for s in sizes}
        assert len(values) == (len(sizes) if key == axis else 1), (key, values)


def test_the_rollout_comparison_counts_tokens_over_the_slowest_replica_and_mismatches():
    from megarl.bench.rollout import compare

    def call(seconds, tokens):
        return {"seconds": seconds, "transition_seconds": 0.01, "token_ids": tokens}

    trainer = {
        "replicas": [
            {"calls": [call(9.0, [[1]]), call(1.0, [[1, 2], [3]])]},  # call 0 is the warm-up
            {"calls": [call(9.0, [[1]]), call(2.0, [[4, 5, 6]])]},
        ]
    }
    standalone = [
        {"seconds": [9.0, 0.5], "token_ids": [[[1]], [[1, 2], [3]]]},
        {"seconds": [9.0, 1.5], "token_ids": [[[1]], [[4, 5, 7]]]},
    ]
    result = compare(trainer, standalone, warmup=1)
    assert result["trainer_tokens_per_s"]["median"] == 6 / 2.0  # 6 tokens, slowest replica 2 s
    assert result["standalone_tokens_per_s"]["median"] == 6 / 1.5
    assert result["ratio"] == pytest.approx(0.75)
    assert (result["samples"], result["mismatched_samples"]) == (3, 1)


def test_model_flops_count_every_linear_layer_six_times_per_token_plus_attention():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from megarl.bench.train import update_flops

    config = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    sequences, seq_len = 3, 10
    attention = 12 * 2 * 64 * seq_len  # layers × hidden × seq_len, per token
    assert update_flops(config, sequences, seq_len) == sequences * seq_len * (6 * linear + attention)


def test_the_async_bench_reads_each_pools_busy_share_and_gives_the_ratio(tmp_path):
    import json

    from megarl.bench.async_training import measured_steps, table

    common = {"response_length/mean": 10.0, "batch/sequences": 32, "response_length/max": 96.0}
    colocated = tmp_path / "colocated.jsonl"
    colocated.write_text(
        "".join(
            json.dumps(
                {
                    "step": s,
                    "step_seconds": 2.0,
                    "timing/generate": 1.5,
                    "generate/engine_seconds": 1.2,
                    **common,
                }
            )
            + "\n"
            for s in (1, 2, 3)
        )
    )
    separate = tmp_path / "separate.jsonl"
    record = {
        "step_seconds": 1.0,
        "async/engine_busy_share": 0.9,
        "async/trainer_busy_share": 0.6,
        "async/staleness_max": 1.0,
        **common,
    }
    separate.write_text("".join(json.dumps({"step": s, **record}) + "\n" for s in (1, 2, 3)))
    c, a = measured_steps(colocated, warmup=1), measured_steps(separate, warmup=1)
    assert len(c) == len(a) == 2  # the warm-up step is left out
    assert c[0]["tokens_per_s"] == 160.0 and c[0]["engine_busy"] == 0.6 and c[0]["trainer_busy"] == 0.25
    assert a[0]["tokens_per_s"] == 320.0 and (a[0]["engine_busy"], a[0]["trainer_busy"]) == (0.9, 0.6)
    summary = {k: {"median": c[0][k], "min": c[0][k], "max": c[0][k], "n": 2} for k in c[0]}
    text = table(
        {
            "cpu": "AMD EPYC",
            "cores": 2,
            "workload": {},
            "variants": {"colocated": {"summary": summary, "ratio_tokens_per_s": 1.0}},
        }
    )
    assert "| colocated | 160 (160–160) | 1.00 | 2.00 (2.00–2.00) |" in text
