"""Megatron vs transformers (fp32, CPU): logits, loss and every gradient, at every layout. One rank
program (tests/multiproc/parity_checks.py, in the 4-rank launch shared with other modules:
tests/multiproc/conftest.py) runs the LM families, the scalar heads, the RoPE scalings and the
mixture-of-experts families with expert parallelism.

The layouts (LAYOUTS): TP1 × DP4 (the plain model, DP averaging), TP2 × PP2 (every TP split and every
PP stage boundary of the model at once), PP2 × VPP2 × DP2 (the interleaved schedule) and TP2 × DP2 with
sequence parallelism. TP2 alone and PP2 alone are left out: TP2 × PP2 runs each of their code paths (each
stage's layers split over TP2, the activations passed between stages), and the DP2 they add is in the SP
and VPP layouts (about 1.3 s a layout and family).

A family whose megatron model is another's checks its own conversion at one layout: Mistral builds Llama's
megatron model (megarl.models.from_hf.FAMILIES: no q/k/v bias, no q/k norm, untied), which runs every
layout. Likewise LoRA runs every layout on Llama and the scalar head SCALAR_LAYOUTS' four, and on Qwen2 (q/k/v
biases, tied embeddings) both run the layouts that split those: TP (with PP, and with SP)."""

import json
import re

import pytest

from tests.conftest import FAMILIES, PARITY_INIT
from tests.helpers.lora import make_peft_adapter
from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

LAYOUTS = ["tp1pp1", "tp2pp2", "tp1pp2vpp2", "tp2pp1sp"]
# Mistral's megatron model is Llama's (the module doc): its checkpoint's conversion at one layout
LAYOUTS_OF = {**{family: LAYOUTS for family in FAMILIES}, "mistral": ["tp1pp1"]}


def _argv(request) -> list[str]:
    """parity_checks' argv: verify's arguments of "lm" (every family at every layout but Mistral) and
    "lm-mistral" (at tp1pp1), "scalar-<family>" (the reward models at SCALAR_LAYOUTS), "rope" (two RoPE
    scalings at TP2, 64 tokens), "moe" (the MoE families at MOE_LAYOUTS), "bf16" (Qwen2 in bf16 at
    BF16_LAYOUTS) and "lora-<family>" (at LORA_LAYOUTS)."""
    from megarl.models.tiny import build_tiny_hf

    root = request.getfixturevalue("tmp_path_factory").mktemp("rope")
    rope_models = [
        build_tiny_hf(root / name, initializer_range=0.1, max_position_embeddings=16384, rope_parameters=rope)
        for name, rope in ROPE_SCALING.items()
    ]

    def hf_args(paths) -> list[str]:
        return [str(a) for path in paths for a in ("--hf", path)]

    moe_models = [build_tiny_hf(root / family, family=family, **PARITY_INIT) for family in MOE_FAMILIES]
    lm, scalar = request.getfixturevalue("tiny_models"), request.getfixturevalue("tiny_reward_models")
    parts = {
        # Megatron's linear layers through OpenBLAS (megarl.models.cpu_gemm), the choice on AMD CPUs, on
        # any CPU: HF's reference multiplies with torch's MKL, and torch's path is megatron's own code.
        "lm": [*hf_args(p for f, p in lm.items() if f != "mistral"), "--layouts", ",".join(LAYOUTS)],
        "lm-mistral": [*hf_args([lm["mistral"]]), "--layouts", ",".join(LAYOUTS_OF["mistral"])],
        **{
            f"scalar-{family}": [*hf_args([scalar[family]]), "--layouts", ",".join(layouts)]
            for family, layouts in SCALAR_LAYOUTS.items()
        },
        "rope": [*hf_args(rope_models), "--layouts", "tp2pp1", "--seq", "64"],
        "moe": [*hf_args(moe_models), "--layouts", ",".join(MOE_LAYOUTS)],
        "bf16": [*hf_args([lm["qwen2"]]), "--layouts", ",".join(BF16_LAYOUTS), "--dtype", "bf16"],
    }
    for family, layouts in LORA_LAYOUTS.items():  # megarl.models.lora.verify: megatron's LoRA vs PEFT's
        adapter = make_peft_adapter(lm[family], root / f"adapter-{family}")
        parts[f"lora-{family}"] = [
            "--hf",
            str(lm[family]),
            "--lora-adapter",
            str(adapter),
            "--layouts",
            ",".join(layouts),
        ]
    return [json.dumps(parts)]


SHARED_PART = ("parity", "tests.multiproc.parity_checks", _argv)


@pytest.fixture(scope="module")
def parity_launch(shared_launch) -> dict[str, list[dict]]:
    """{part: verify's result rows} of "lm" (with "lm-mistral"), "scalar" (every "scalar-<family>"),
    "rope", "moe" and "lora-<family>"."""
    results = shared_result(shared_launch, "parity")
    merged = {"lm-mistral": "lm", **{f"scalar-{family}": "scalar" for family in SCALAR_LAYOUTS}}
    parts = {merged.get(r["part"], r["part"]) for r in results}
    return {part: [r for r in results if merged.get(r["part"], r["part"]) == part] for part in parts}


@pytest.fixture(scope="module")
def parity(parity_launch) -> list[dict]:
    return parity_launch["lm"]


def test_parity_ran_megatrons_linear_layers_through_openblas(parity):
    assert {r["gemm"] for r in parity} == {"openblas"}


def rows_of(parity, family):
    rows = [r for r in parity if r["family"] == family]
    layouts = LAYOUTS_OF[family]
    assert len(rows) == len(layouts), f"{family}: {len(rows)} results for {len(layouts)} layouts"
    return rows


def layout_of(row: dict) -> str:
    """verify's layout description ("tp2xpp1xdp2xsp") as the argv writes it ("tp2pp1sp")."""
    return re.sub(r"xdp\d+", "", row["layout"]).replace("x", "")


def test_every_layout_of_every_family_was_checked(parity):
    checked = {(r["family"], layout_of(r)) for r in parity}
    assert checked == {(family, layout) for family in FAMILIES for layout in LAYOUTS_OF[family]}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf_fp32_within_5e5(parity, family):
    for r in rows_of(parity, family):
        assert r["hf_logits_abs_max"] > 1.0, "logits too small for the comparison to mean anything"
        assert r["max_abs_logit_diff"] <= 5e-5, r


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_and_gradients_match_hf_at_every_layout(parity, family):
    for r in rows_of(parity, family):
        assert r["loss_abs_diff"] <= 5e-6, r
        assert r["max_abs_grad_diff"] <= 5e-5, r
        assert r["grad_norm_rel_diff"] <= 1e-5, r


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_and_grad_norm_identical_across_layouts(parity, family):
    rows = rows_of(parity, family)
    losses = [r["loss"] for r in rows]
    norms = [r["grad_norm"] for r in rows]
    assert max(losses) - min(losses) <= 5e-6
    assert (max(norms) - min(norms)) / norms[0] <= 1e-5


SCALAR_LAYOUTS = {"llama": ["tp1pp1", "tp2pp2", "tp1pp2vpp2", "tp2pp1sp"], "qwen2": ["tp2pp2", "tp2pp1sp"]}


@pytest.fixture(scope="module")
def scalar_parity(parity_launch) -> list[dict]:
    return parity_launch["scalar"]


@pytest.mark.parametrize("family", SCALAR_LAYOUTS)
def test_scalar_head_scores_and_gradients_match_hf(scalar_parity, family):
    rows = [r for r in scalar_parity if r["family"] == family]
    assert sorted(map(layout_of, rows)) == sorted(SCALAR_LAYOUTS[family])
    for r in rows:
        assert r["head"] == "scalar" and r["hf_logits_abs_max"] > 1.0
        assert r["max_abs_logit_diff"] <= 5e-5, r
        assert r["loss_abs_diff"] <= 5e-6, r
        assert r["max_abs_grad_diff"] <= 5e-5, r
        assert r["grad_norm_rel_diff"] <= 1e-5, r


ROPE_SCALING = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_theta": 5e5,
    },
    "linear": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
}


def test_rope_scaling_matches_hf(parity_launch):
    results = parity_launch["rope"]
    assert len(results) == 2
    for r in results:
        assert r["max_abs_logit_diff"] <= 5e-5 and r["loss_abs_diff"] <= 5e-6, r


# untied at every layout; tied embeddings with q/k/v bias where TP splits the biased q/k/v adapters
LORA_LAYOUTS = {"llama": LAYOUTS, "qwen2": ["tp1pp1", "tp2pp2", "tp2pp1sp"]}


@pytest.mark.parametrize("family", LORA_LAYOUTS)
def test_lora_matches_peft_at_every_layout(parity_launch, family):
    """The same adapter weights in megatron's LoRA and in PEFT's on the transformers model: logits, loss
    and every adapter gradient; fresh adapters (B = 0) and disabled ones give bitwise the base logits."""
    rows = parity_launch[f"lora-{family}"]
    assert sorted(map(layout_of, rows)) == sorted(LORA_LAYOUTS[family])
    for r in rows:
        assert r["init_equals_base"] and r["disabled_equals_base"], r
        assert r["adapter_effect"] > 0.1, (
            "the adapter must change the logits for the comparison to mean anything"
        )
        assert r["max_abs_logit_diff"] <= 5e-5 and r["merged_logit_diff"] <= 5e-5, r
        assert r["loss_abs_diff"] <= 5e-6 and r["max_abs_grad_diff"] <= 5e-5, r
        assert r["grad_norm_rel_diff"] <= 1e-5 and not r["missing_grads"], r


# EP1 (4-way DP, so each expert's gradient is averaged over DP), EP2, TP2×EP2 (experts split over
# expert-TP = TP; megatron needs SP there), PP2; the all-to-all token dispatcher over gloo.
MOE_FAMILIES = ["qwen3_moe", "qwen2_moe"]  # top-k renormalised; not renormalised + gated shared expert
MOE_LAYOUTS = ["tp1pp1", "tp1pp1ep2", "tp2pp1ep2sp", "tp1pp2"]


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_logits_loss_and_gradients_match_hf_at_every_expert_layout(parity_launch, family):
    rows = [r for r in parity_launch["moe"] if r["family"] == family]
    assert sorted(re.sub(r"xdp\d+", "", r["layout"]) for r in rows) == sorted(
        ["tp1xpp1", "tp1xpp1xep2", "tp2xpp1xep2xsp", "tp1xpp2"]
    )
    for r in rows:
        assert r["hf_logits_abs_max"] > 1.0
        assert r["max_abs_logit_diff"] <= 5e-5, r
        assert r["loss_abs_diff"] <= 5e-6 and r["max_abs_grad_diff"] <= 5e-5, r
        assert r["grad_norm_rel_diff"] <= 1e-5, r
        assert r["round_trip_exact"], r  # HF -> megatron shards (EP, expert-TP) -> HF, bit for bit


# bf16 (TP1 Llama: tests/unit/models/test_verify_bf16.py): tied embeddings and q/k/v bias, TP2 with
# sequence parallelism, and PP2 (bf16 activations between stages).
BF16_LAYOUTS = ["tp2pp1sp", "tp1pp2"]


def test_bf16_error_within_factor_of_transformers_own_bf16_error(parity_launch):
    rows = parity_launch["bf16"]
    assert sorted(re.sub(r"xdp\d+", "", r["layout"]) for r in rows) == ["tp1xpp2", "tp2xpp1xsp"]
    for r in rows:
        assert r["dtype"] == "bf16" and r["round_trip_exact"], r
        for metric, v in r["bf16"].items():
            assert v["passed"] and v["megatron_bf16_err"] > 0 and v["hf_bf16_err"] > 0, (metric, v)
