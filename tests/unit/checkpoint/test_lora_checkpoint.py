"""The pure pieces of LoRA checkpoints: the settings a checkpoint records, the mismatches it refuses, the
adapter entries of a sharded state dict, and the merged HF model against PEFT's merge_and_unload."""

from types import SimpleNamespace

import pytest
import torch

from megarl.checkpoint.format import CheckpointError
from megarl.checkpoint.lora_state import adapter_entries, check_lora, lora_meta, settings
from megarl.models.from_hf import ModelArchitecture

CFG = SimpleNamespace(
    rank=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"], exclude_modules=[], init_A="kaiming"
)
ARCH = ModelArchitecture.from_hf_config(
    {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "vocab_size": 100,
    }
)


def _meta(cfg=CFG):
    return {"lora": lora_meta(cfg, "/models/base")}


def test_meta_records_the_settings_and_the_base():
    entry = lora_meta(CFG, "/models/base")
    assert entry == {
        "rank": 4,
        "alpha": 8.0,
        "dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "exclude_modules": [],
        "init_A": "kaiming",
        "base_model_path": "/models/base",
    }
    assert vars(settings(entry)) == {k: v for k, v in entry.items() if k != "base_model_path"}


def test_matching_settings_load():
    check_lora(_meta(), CFG, ARCH, "ckpt")
    check_lora({}, None, ARCH, "ckpt")  # a full checkpoint into a full model
    # other words for the same adapters: the megatron name of the projections
    check_lora(_meta(), SimpleNamespace(**{**vars(CFG), "target_modules": ["q_proj", "v_proj"]}), ARCH, "c")


@pytest.mark.parametrize(
    "meta, cfg, words",
    [
        (_meta(), None, ["holds LoRA adapters only", "rank=4", "set critic.lora.rank=4", "--merge-lora"]),
        ({}, CFG, ["is a full checkpoint", "set critic.lora.rank=0", "model.path"]),
        (
            _meta(),
            SimpleNamespace(**{**vars(CFG), "alpha": 16}),
            ["alpha=8.0", "alpha=16.0", "critic.lora.alpha=8.0"],
        ),
        (
            _meta(),
            SimpleNamespace(**{**vars(CFG), "target_modules": "linear_qkv"}),
            [
                "target_modules=['q_proj', 'v_proj']",
                "target_modules='linear_qkv'",
                "critic.lora.target_modules",
            ],
        ),
        (
            _meta(),
            SimpleNamespace(**{**vars(CFG), "exclude_modules": ["model.layers.1.*"]}),
            ["exclude_modules=[]", "critic.lora.exclude_modules=[]"],
        ),
    ],
)
def test_mismatches_are_refused_with_the_keys_and_the_fix(meta, cfg, words):
    with pytest.raises(CheckpointError) as e:
        check_lora(meta, cfg, ARCH, "ckpt", role="critic")
    for word in words:
        assert word in str(e.value), str(e.value)


def test_adapter_entries_are_the_lora_keys():
    state = {
        "decoder.layers.0.self_attention.linear_qkv.weight": 1,
        "decoder.layers.0.self_attention.linear_qkv.lora.q_proj.lora_A": 2,
        "decoder.layers.0.mlp.linear_fc2.lora.down_proj.lora_B": 3,
        "embedding.word_embeddings.weight": 4,
    }
    assert set(adapter_entries(state)) == {
        "decoder.layers.0.self_attention.linear_qkv.lora.q_proj.lora_A",
        "decoder.layers.0.mlp.linear_fc2.lora.down_proj.lora_B",
    }


def test_merged_hf_model_equals_peft_merge_and_unload(tmp_path):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from megarl.checkpoint.lora_export import write_merged_hf
    from megarl.models.tiny import build_tiny_hf

    base = build_tiny_hf(tmp_path / "base", num_hidden_layers=2)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    adapter = {
        n.replace(".default", ""): p.detach().clone()
        for n, p in peft_model.named_parameters()
        if "lora_" in n
    }
    cfg = SimpleNamespace(rank=4, alpha=8.0)
    result = write_merged_hf(base, adapter, cfg, tmp_path / "merged", max_shard_size="100KB")
    assert not (tmp_path / "merged.partial").exists() and (tmp_path / "merged" / "config.json").is_file()
    want = peft_model.merge_and_unload().state_dict()
    got = {}
    for f in (tmp_path / "merged").glob("*.safetensors"):
        got.update(load_file(f))
    assert result["bytes"] == sum(t.numel() * t.element_size() for t in got.values())
    assert (
        set(got) == set(load_file(base / "model.safetensors"))
        and len(list((tmp_path / "merged").glob("*.safetensors"))) > 1
    )
    for name, tensor in got.items():
        torch.testing.assert_close(tensor, want[name], rtol=0, atol=1e-6)
    base_q = load_file(base / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    assert (got["model.layers.0.self_attn.q_proj.weight"] - base_q).abs().max() > 1e-3  # it merged something


def test_merge_refuses_an_adapter_for_a_module_the_base_lacks(tmp_path):
    from megarl.checkpoint.lora_export import write_merged_hf
    from megarl.models.tiny import build_tiny_hf

    base = build_tiny_hf(tmp_path / "base", num_hidden_layers=1)
    adapter = {
        "base_model.model.model.layers.5.self_attn.q_proj.lora_A.weight": torch.zeros(4, 8),
        "base_model.model.model.layers.5.self_attn.q_proj.lora_B.weight": torch.zeros(8, 4),
    }
    with pytest.raises(CheckpointError, match="has no weight for the adapter's .*layers.5.self_attn.q_proj"):
        write_merged_hf(base, adapter, SimpleNamespace(rank=4, alpha=8.0), tmp_path / "merged")
    assert not (tmp_path / "merged").exists() and not (tmp_path / "merged.partial").exists()
