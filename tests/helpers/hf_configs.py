"""A tiny Llama's Hugging Face config.json, for the config tests that need a model directory but no
weights (the loader reads heads, layers and positions from it)."""

from __future__ import annotations

import json
from pathlib import Path

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_hidden_layers": 4,
    "vocab_size": 1001,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def write_model_config(directory: Path, hf_config: dict) -> Path:
    """`directory` created, holding `hf_config` as its config.json; returns it."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf_config))
    return directory
