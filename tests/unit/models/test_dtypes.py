"""The dtype table: config names, torch dtypes and Hugging Face / vLLM names map onto each other."""

import pytest
import torch

from megarl.models import dtypes

pytestmark = pytest.mark.unit


def test_each_config_name_maps_to_torch_and_hf_and_back():
    assert dtypes.torch_dtype("bf16") is torch.bfloat16
    assert dtypes.hf_name("fp16") == "float16"
    for name in dtypes.DTYPE_NAMES:
        assert dtypes.from_hf_name(dtypes.hf_name(name)) == name
        assert str(dtypes.torch_dtype(name)) == f"torch.{dtypes.hf_name(name)}"


def test_unknown_names():
    with pytest.raises(ValueError, match="unknown dtype 'fp8'; use one of fp32, bf16, fp16"):
        dtypes.torch_dtype("fp8")
    assert dtypes.from_hf_name("float64") == "fp32"
