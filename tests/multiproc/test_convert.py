"""`megarl convert`: HF -> megatron dist-checkpoint at a TP/PP layout -> HF is bit-exact."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.multiproc


def megarl(*argv):
    return subprocess.run(
        [sys.executable, "-m", "megarl.cli", *map(str, argv)], capture_output=True, text=True
    )


# TP splitting of both families, PP splitting (family-agnostic) once, the scalar head under TP; each
# case costs two launches (~50 s), so no more than that
@pytest.mark.parametrize("family, tp, pp, head", [("qwen2", 2, 2, "lm"), ("llama", 2, 1, "scalar")])
def test_hf_to_mcore_to_hf_round_trip_is_bit_exact(
    tiny_models, tiny_reward_models, tmp_path, family, tp, pp, head
):
    source = (tiny_models if head == "lm" else tiny_reward_models)[family]
    ckpt, back = tmp_path / "mcore", tmp_path / "hf"
    to_mcore = megarl("convert", "hf-to-mcore", "--hf", source, "--out", ckpt, "--tp", tp, "--pp", pp)
    assert to_mcore.returncode == 0, to_mcore.stderr[-3000:]
    assert not (tmp_path / "mcore.partial").exists()
    to_hf = megarl("convert", "mcore-to-hf", "--ckpt", ckpt, "--out", back)
    assert to_hf.returncode == 0, to_hf.stderr[-3000:]

    original = load_file(source / "model.safetensors")
    restored = load_file(back / "model.safetensors")
    assert original.keys() == restored.keys()
    for name, tensor in original.items():
        assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name
    assert (back / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
