import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from megarl.models.tiny import ALL_TINY_FAMILIES, HF_ONLY_FAMILIES, TINY_FAMILIES, build_tiny_hf

pytestmark = pytest.mark.unit

VOCAB = 1001


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {
        family: build_tiny_hf(root / family, family=family, num_hidden_layers=2) for family in TINY_FAMILIES
    }


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_reloads_with_family_features(tiny_dirs, family):
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[family])
    cfg = model.config
    attn = model.model.layers[0].self_attn
    assert cfg.vocab_size == VOCAB
    assert cfg.num_hidden_layers == 2
    assert cfg.head_dim == 32
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    biased = family in ("qwen2", "qwen2_moe")
    assert (attn.q_proj.bias is not None) == biased
    assert (attn.k_proj.bias is not None) == biased
    assert (attn.v_proj.bias is not None) == biased
    assert hasattr(attn, "q_norm") == hasattr(attn, "k_norm") == (family in ("qwen3", "qwen3_moe"))
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == (family == "qwen2")
    assert not torch.allclose(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    if biased:
        assert attn.q_proj.bias.abs().sum() > 0
    mlp = model.model.layers[0].mlp
    assert hasattr(mlp, "experts") == family.endswith("_moe")
    assert hasattr(mlp, "shared_expert_gate") == (family == "qwen2_moe")
    if family.endswith("_moe"):  # 4 experts, top-2, a random (not all-zero) router
        assert (cfg.num_experts, cfg.num_experts_per_tok) == (4, 2)
        assert mlp.gate.weight.abs().min() > 0


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_forward_gives_finite_logits(tiny_dirs, family):
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs[family])
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs[family])
    batch = tokenizer(["12 + 7 = 19", "the sum is"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, VOCAB)
    assert torch.isfinite(logits).all()


def test_tokenizer_round_trips_and_fits_vocab(tiny_dirs):
    path = tiny_dirs["llama"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model_cfg = AutoModelForCausalLM.from_pretrained(path).config
    ids = tokenizer("12 + 7 = 19")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12 + 7 = 19"
    assert len(tokenizer) <= VOCAB
    assert max(tokenizer.get_vocab().values()) < VOCAB
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (
        model_cfg.pad_token_id,
        model_cfg.bos_token_id,
        model_cfg.eos_token_id,
    )
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3


def test_chat_template_renders_turns(tiny_dirs):
    tokenizer = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    messages = [
        {"role": "system", "content": "Solve it."},
        {"role": "user", "content": "12 + 7 ="},
        {"role": "assistant", "content": "19"},
        {"role": "user", "content": "3 * 4 ="},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith(tokenizer.bos_token)
    assert text.count("<|im_start|>") == 5
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") in ids


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    a = load_file(
        build_tiny_hf(tmp_path / "a", family="qwen2", seed=3, num_hidden_layers=1) / "model.safetensors"
    )
    b = load_file(
        build_tiny_hf(tmp_path / "b", family="qwen2", seed=3, num_hidden_layers=1) / "model.safetensors"
    )
    c = load_file(
        build_tiny_hf(tmp_path / "c", family="qwen2", seed=4, num_hidden_layers=1) / "model.safetensors"
    )
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not any(torch.equal(a[k], c[k]) for k in a)


def test_overrides_and_unknown_family(tmp_path):
    path = build_tiny_hf(
        tmp_path / "m", family="mistral", num_hidden_layers=1, hidden_size=64, num_attention_heads=2
    )
    cfg = AutoModelForCausalLM.from_pretrained(path).config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.head_dim) == (1, 64, 32)
    with pytest.raises(ValueError, match="unknown tiny model family"):
        build_tiny_hf(tmp_path / "x", family="gpt2")


@pytest.mark.parametrize("family", sorted(HF_ONLY_FAMILIES))
def test_hf_only_families_build_with_the_shared_tokenizer(tmp_path, family):
    path = build_tiny_hf(tmp_path / family, family=family, num_hidden_layers=1)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == {"phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}[family]
    assert (model.config.vocab_size, model.config.head_dim, model.config.num_hidden_layers) == (VOCAB, 32, 1)
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (
        model.config.pad_token_id,
        model.config.eos_token_id,
    )
    batch = tokenizer(["12 + 7 = 19", "the sum is"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert torch.isfinite(model(**batch).logits).all()


def test_cli_offers_every_tiny_family():
    import argparse

    from megarl.cli import model as model_cli

    commands = argparse.ArgumentParser().add_subparsers()
    model_cli.register(commands)
    family = next(a for a in commands.choices["tiny-model"]._actions if a.dest == "family")
    assert sorted(family.choices) == sorted(ALL_TINY_FAMILIES)
