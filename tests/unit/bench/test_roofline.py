"""The roofline's FLOP counts against torch's own counter on a transformers Llama, and its floor arithmetic."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from megarl.bench.flops import Decoder, Phase, Sequences, generation_phases, log_prob_phases, update_phases
from megarl.bench.roofline import phase_floor, stage_rows, step_sequences, table
from megarl.cli import build_parser
from megarl.cli.bench import bench_suite
from megarl.models.tiny import tiny_config

pytestmark = pytest.mark.unit

BATCH, LENGTH = 2, 24


@pytest.fixture(scope="module")
def llama():
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama")
    config._attn_implementation = "eager"  # attention as bmm, so the counter separates it from the GEMMs
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config), Decoder.from_hf(config)


def _counted(model, backward: bool) -> dict[str, int]:
    ids = torch.randint(0, model.config.vocab_size, (BATCH, LENGTH))
    with FlopCounterMode(display=False) as counter:
        logits = model(ids).logits
        if backward:
            logits.sum().backward()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_the_command_parses_with_the_e2e_sizes():
    args = build_parser().parse_args(["bench", "roofline"])
    assert args.func is bench_suite and args.what == "roofline"
    assert (args.sizes, args.steps, args.device) == (["tiny", "3m", "25m"], None, "cpu")


def test_decoder_counts_every_parameter_of_the_hf_model(llama):
    model, decoder = llama
    assert decoder.params() == sum(p.numel() for p in model.parameters())


def test_forward_gemm_and_attention_flops_match_torch_flop_counter(llama):
    model, decoder = llama
    counted = _counted(model, backward=False)
    seqs = Sequences(count=BATCH, prompt=LENGTH - 8, response=8, response_max=8)
    (forward,) = log_prob_phases(decoder, seqs).values()
    assert sum(forward.gemm_flops.values()) == pytest.approx(counted["aten.mm"], rel=1e-12)
    # eager attention multiplies the whole L×L square; the roofline counts the causal triangle
    dense = BATCH * decoder.attention_flops(LENGTH) * 2 * LENGTH / (LENGTH + 1)
    assert dense == pytest.approx(counted["aten.bmm"], rel=1e-12)


def test_update_gemm_flops_are_forward_plus_backward_as_torch_counts_them(llama):
    model, decoder = llama
    counted = _counted(model, backward=True)
    seqs = Sequences(count=BATCH, prompt=LENGTH - 8, response=8, response_max=8)
    compute = update_phases(decoder, seqs)["forward_backward"]
    assert sum(compute.gemm_flops.values()) == pytest.approx(counted["aten.mm"], rel=1e-12)


def test_generation_is_one_forward_over_prompt_and_response_but_the_last_token():
    decoder = Decoder.from_hf(tiny_config("llama"))
    seqs = Sequences(count=8, prompt=20, response=10, response_max=10)
    phases = generation_phases(decoder, seqs)
    whole = log_prob_phases(decoder, Sequences(count=8, prompt=20, response=9, response_max=9))["forward"]
    assert sum(p.flops for p in phases.values()) == pytest.approx(whole.flops, rel=1e-12)
    # decode: 9 steps per engine, each reading the weights; the KV cache read grows by a token a step
    kv = 8 * sum(20 + j for j in range(1, 10)) * decoder.kv_bytes_per_token()
    assert phases["decode"].bytes == pytest.approx(2 * 9 * decoder.matrix_params() * 4 + kv, rel=1e-12)


PEAKS = {
    "gemm": {"64x8x8": {"flops_per_s": 1e9, "by": "torch"}, "32x8x8": {"flops_per_s": 0.5e9, "by": "torch"}},
    "peak_flops_per_s": 2e9,
    "bandwidth_bytes_per_s": 1e9,
    "copy": 1e9,
    "read": 0.9e9,
    "nominal_flops_per_s": None,
}


def test_a_phase_floor_is_the_larger_of_compute_at_each_shapes_rate_and_bytes_over_bandwidth():
    phase = Phase(gemm_flops={(64, 8, 8): 2e9, (32, 8, 8): 1e9}, other_flops=4e9, bytes=3e9)
    floor = phase_floor(phase, PEAKS)
    assert floor["compute_s"] == pytest.approx(2.0 + 2.0 + 2.0)
    assert floor["memory_s"] == pytest.approx(3.0)
    assert floor["floor_s"] == pytest.approx(6.0)


def test_stage_rows_give_time_over_floor_and_mfu_and_skip_stages_not_run(monkeypatch):
    from megarl.bench import roofline

    phases = {"update": lambda m, s: {"a": Phase({(64, 8, 8): 2e9}), "b": Phase(bytes=3e9)}}
    monkeypatch.setattr(roofline, "STAGE_PHASES", {**phases, "log_probs": phases["update"]})
    split = {"generation": 0.0, "log_probs": 0.0, "update": 10.0, "transition": 0.0, "other": 0.5}
    rows = stage_rows(None, None, split, PEAKS)
    assert set(rows) == {"update", "other"}
    assert rows["update"]["floor_s"] == pytest.approx(5.0)
    assert rows["update"]["time_over_floor"] == pytest.approx(2.0)
    assert rows["update"]["mfu"] == pytest.approx(2e9 / 10.0 / 2e9)
    assert rows["update"]["bound"] == "memory"
    assert rows["other"] == {"seconds": 0.5}


def test_step_sequences_and_table_from_a_metrics_record():
    record = {
        "batch/sequences": 64,
        "throughput/tokens_per_s": 64 * 90 / 2.0,
        "step_seconds": 2.0,
        "response_length/mean": 60.0,
        "response_length/max": 64,
    }
    seqs = step_sequences(record)
    assert (seqs.count, seqs.prompt, seqs.response, seqs.response_max) == (64, 30.0, 60.0, 64)
    result = {
        "cores": 2,
        "cpu": "AMD EPYC",
        "sizes": {
            "tiny": {
                "params": 850_000,
                "sequences": seqs.__dict__,
                "peaks": PEAKS,
                "median": {
                    "update": {
                        **dict(seconds=1.0, flops=2e9, bytes=1e9, floor_s=0.5, time_over_floor=2.0, mfu=0.5),
                        "bound": "compute",
                    },
                    "other": {"seconds": 0.1},
                },
            }
        },
    }
    text = table(result)
    assert (
        "| tiny (0.85M, 64 seqs × 30.0+60.0 tok) | update | 1.000 | 2.00 | 1.000 | 0.500 | compute | **2.00×** | 50.0% |"
        in text
    )


def test_a_shape_not_measured_takes_the_rate_of_the_nearest_measured_one():
    from megarl.bench.roofline import gemm_rate

    assert gemm_rate(PEAKS, (64, 8, 8)) == 1e9
    assert gemm_rate(PEAKS, (60, 8, 8)) == 1e9
    assert gemm_rate(PEAKS, (30, 8, 8)) == 0.5e9
