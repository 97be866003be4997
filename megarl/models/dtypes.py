"""The model dtypes megarl accepts, in one table: config name <-> torch dtype <-> Hugging Face / vLLM name.

The config (`model.dtype`) and the CLI spell them "fp32" | "bf16" | "fp16"; torch, Hugging Face
(`torch_dtype` in config.json) and vLLM (`LLM(dtype=...)`) spell them "float32" | "bfloat16" |
"float16". Torch is imported only to build a torch dtype, so config and CLI code can use the names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# config name -> the torch / Hugging Face / vLLM name
_TABLE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

DTYPE_NAMES = tuple(_TABLE)  # the config names, in the order the docs list them


def hf_name(name: str) -> str:
    """The Hugging Face / vLLM name of config dtype `name` ("bf16" -> "bfloat16")."""
    if name not in _TABLE:
        raise ValueError(f"unknown dtype {name!r}; use one of {', '.join(DTYPE_NAMES)}")
    return _TABLE[name]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of config dtype `name` ("bf16" -> torch.bfloat16)."""
    import torch

    return getattr(torch, hf_name(name))


def from_hf_name(hf: str, default: str = "fp32") -> str:
    """The config name of a Hugging Face dtype name ("bfloat16" -> "bf16"); `default` for any other."""
    return next((name for name, value in _TABLE.items() if value == hf), default)
