"""Adapter-only role checkpoints of a LoRA model and its exports (issue 44, item 4). The rank side
(lora_checkpoint_checks) runs in the shared 2-rank launch: TP2 save → same-layout resume and TP1×PP2 load,
the refused mismatches, the live PEFT/merged export; here the exports are loaded by `peft` and
transformers and compared with the megatron model's logits."""

import json

import pytest
import torch

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

SHARED_PART_2 = (
    "lora_checkpoint",
    "tests.multiproc.lora_checkpoint_checks:main",
    lambda request: [
        request.getfixturevalue("tiny_models")["llama"],
        request.getfixturevalue("tmp_path_factory").mktemp("lora_ckpt"),
    ],
)
TOLERANCE = 5e-5  # fp32 logits: megatron's LoRA model vs PEFT on transformers / the merged model


@pytest.fixture(scope="module")
def result(shared_launch_2):
    return shared_result(shared_launch_2, "lora_checkpoint")


@pytest.fixture(scope="module")
def saved(result):
    from pathlib import Path

    root = Path(result["dir"])
    return {"root": root, **torch.load(root / "saved.pt")}


def test_same_layout_resume_continues_bit_exactly(result):
    r = result["tp2"]
    assert r["report"]["optimizer"] == "loaded" and r["report"]["rng"] == "restored"
    assert r["adapters_loaded_bitwise"] and r["adapters_after_equal"] and r["moments_equal"]
    assert r["losses_b"] == r["losses_a"]


def test_tp2_checkpoint_loads_at_tp1pp2(result):
    r = result["tp1pp2"]
    assert r["report"]["optimizer"] == "loaded" and r["report"]["rng"] == "reseeded (layout changed)"
    assert r["adapters_loaded_bitwise"]
    assert r["max_abs_logit_diff"] <= TOLERANCE < r["adapter_effect"]
    assert r["losses"] == pytest.approx(r["losses_uninterrupted"], rel=1e-5)


def test_checkpoint_holds_only_the_adapters(result, saved):
    meta = json.loads((saved["root"] / "ckpt" / "megarl_checkpoint.json").read_text())
    assert meta["lora"] == {
        "rank": 8,
        "alpha": 16.0,
        "dropout": 0.0,
        "target_modules": "all-linear",
        "exclude_modules": ["o_proj"],
        "init_A": "kaiming",
        "base_model_path": meta["source"],
    }
    adapter = result["tp2"]["adapter_bytes"]
    # the dist-checkpoint's data files plus its metadata: about the adapter bytes, far below the base's
    assert adapter <= result["model_bytes"] < 1.5 * adapter + 64_000
    assert result["model_bytes"] * 5 < result["base_bytes"] <= result["refused"]["full_bytes"]


@pytest.mark.parametrize(
    "case, words",
    [
        ("lora_into_plain", ["holds LoRA adapters only", "rank=8", "set actor.lora.rank=8", "--merge-lora"]),
        ("other_rank", ["saved with LoRA rank=8", "this model has rank=4", "set actor.lora.rank=8"]),
        ("full_into_lora", ["is a full checkpoint", "set actor.lora.rank=0", "model.path"]),
    ],
)
def test_mismatched_checkpoints_are_refused_with_the_fix(result, case, words):
    message = result["refused"]["errors"][case]
    for word in words:
        assert word in message, message
    assert result["refused"]["unchanged"]


def _peft_logits(base, adapter_dir, tokens):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    with torch.no_grad():
        return model(input_ids=tokens[:, :-1]).logits


def test_peft_exports_give_the_megatron_logits(saved, tiny_models, tmp_path):
    from safetensors.torch import load_file

    from megarl.checkpoint.hf_export import export_checkpoint_hf

    root = saved["root"]
    offline = export_checkpoint_hf(root / "ckpt", tmp_path / "peft")
    assert offline["adapter_tensors"] == len(saved["adapter"])
    for out in (tmp_path / "peft", root / "peft_live"):
        tensors = load_file(out / "adapter_model.safetensors")
        assert tensors.keys() == saved["adapter"].keys()
        assert all(torch.equal(tensors[k], v) for k, v in saved["adapter"].items())
        config = json.loads((out / "adapter_config.json").read_text())
        assert config["r"] == 8 and config["base_model_name_or_path"] == str(tiny_models["llama"])
        logits = _peft_logits(tiny_models["llama"], out, saved["tokens"])
        assert (logits - saved["logits"]).abs().max().item() <= TOLERANCE


def test_merged_exports_give_the_megatron_logits(saved, tiny_models, tmp_path):
    from megarl.cli import main

    root = saved["root"]
    out = tmp_path / "merged"
    assert (
        main(["convert", "mcore-to-hf", "--ckpt", str(root / "ckpt"), "--out", str(out), "--merge-lora"]) == 0
    )
    base = _peft_logits(tiny_models["llama"], None, saved["tokens"])
    for merged in (out, root / "merged_live"):
        logits = _peft_logits(merged, None, saved["tokens"])
        assert (logits - saved["logits"]).abs().max().item() <= TOLERANCE < (logits - base).abs().max().item()


@pytest.mark.parametrize(
    "case, words",
    [
        ("full", ["is a full checkpoint, not a LoRA one", "leave them out"]),
        ("no_base", ["nowhere is not there", "pass --base DIR"]),
        ("other_base", ["--base", "has family qwen2", "the adapters' model had family llama"]),
    ],
)
def test_refused_exports_name_the_fix(saved, tiny_models, tmp_path, case, words):
    from megarl.checkpoint.format import CheckpointError
    from megarl.checkpoint.hf_export import export_checkpoint_hf

    ckpt = saved["root"] / ("full" if case == "full" else "ckpt")
    base = {"full": None, "no_base": tmp_path / "nowhere", "other_base": tiny_models["qwen2"]}[case]
    with pytest.raises(CheckpointError) as e:
        export_checkpoint_hf(ckpt, tmp_path / "out", merge_lora=True, base=base)
    for word in words:
        assert word in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
