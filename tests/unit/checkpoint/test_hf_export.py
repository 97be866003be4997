"""export_checkpoint_hf on dist-checkpoints laid out like megatron's (layer-stacked keys at TP=1 shapes,
padded vocabulary), for every family, in one process. Real megatron TP2xPP2 checkpoints are covered by
tests/multiproc/test_convert.py."""

import pytest
import torch
from safetensors.torch import load_file

from megarl.checkpoint.hf_export import export_checkpoint_hf
from megarl.models.convert.hf_io import HFCheckpointReader
from tests.helpers.checkpoints import fake_megatron_checkpoint

pytestmark = pytest.mark.unit


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_every_family_exports_bit_exact_in_shards(tiny_models, tmp_path, family):
    source = tiny_models[family]
    ckpt = fake_megatron_checkpoint(source, tmp_path / "ckpt")
    result = export_checkpoint_hf(ckpt, tmp_path / "hf", max_shard_size="700KB")
    assert result["shards"] >= 3 and not (tmp_path / "hf.partial").exists()
    original, restored = load_file(source / "model.safetensors"), HFCheckpointReader(tmp_path / "hf")
    assert sorted(original) == sorted(restored.names())
    for name, tensor in original.items():
        assert torch.equal(restored.get(name), tensor), name


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_export_refuses_an_existing_output(tiny_models, tmp_path):
    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    (tmp_path / "hf").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        export_checkpoint_hf(ckpt, tmp_path / "hf")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_truncated_shard_or_a_code_carrying_metadata_is_refused_by_name(tiny_models, tmp_path):
    import os
    import pickle

    from megarl.checkpoint.format import CheckpointError
    from megarl.checkpoint.manifest import write_manifest

    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    write_manifest(ckpt)  # as a run's role checkpoint has
    shard = next((ckpt / "model").glob("*.distcp"))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{shard.name} is truncated or altered"):
        export_checkpoint_hf(ckpt, tmp_path / "hf")
    shard.write_bytes(data)
    (ckpt / "manifest.json").unlink()
    (ckpt / "model" / ".metadata").write_bytes(pickle.dumps(os.system))  # would run code if unpickled
    with pytest.raises(CheckpointError, match=r"cannot be read.*refusing to load posix.system"):
        export_checkpoint_hf(ckpt, tmp_path / "hf2")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf2").exists()
