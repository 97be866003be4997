"""Pure parts of the role checkpoint: the manifest, the architecture fingerprint, RNG state as JSON +
safetensors, and the no-code unpickling of DCP metadata (single process, no megatron groups)."""

from __future__ import annotations

import io
import json
import os
import pickle
import random

import numpy as np
import pytest
import torch

from megarl.checkpoint import manifest as mf
from megarl.checkpoint.format import CheckpointError
from megarl.models.from_hf import ModelArchitecture

pytestmark = pytest.mark.unit


@pytest.fixture
def role_dir(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "__0_0.distcp").write_bytes(os.urandom(5000))
    (tmp_path / "model" / "__1_0.distcp").write_bytes(os.urandom(3000))
    (tmp_path / "scheduler.json").write_text(json.dumps({"num_steps": 3}))
    mf.write_manifest(tmp_path)
    return tmp_path


def test_manifest_lists_every_file_with_size_and_crc(role_dir):
    manifest = mf.read_manifest(role_dir)
    paths = [e["path"] for e in manifest["files"]]
    assert paths == ["model/__0_0.distcp", "model/__1_0.distcp", "scheduler.json"]
    assert manifest["files"][0]["size"] == 5000
    assert mf.check_files(role_dir, manifest) == []


def test_truncated_file_is_named_with_both_sizes(role_dir):
    shard = role_dir / "model" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:2000])
    [problem] = mf.check_files(role_dir, mf.read_manifest(role_dir))
    assert str(shard) in problem and "2000 bytes" in problem and "says 3000" in problem


def test_corrupt_file_is_found_only_by_the_rank_that_checks_it(role_dir):
    shard = role_dir / "model" / "__0_0.distcp"  # file 0: rank 0 of 2 reads its checksum
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    manifest = mf.read_manifest(role_dir)
    assert mf.check_files(role_dir, manifest, rank=1, world=2) == []
    [problem] = mf.check_files(role_dir, manifest, rank=0, world=2)
    assert "corrupt" in problem and "CRC-32" in problem and str(shard) in problem


def test_missing_and_corrupt_manifest(tmp_path, role_dir):
    with pytest.raises(CheckpointError, match="never completed"):
        mf.read_manifest(tmp_path / "nothing")
    (role_dir / "manifest.json").write_text('{"files": [{"path": 1}')
    with pytest.raises(CheckpointError, match="manifest.json is corrupt"):
        mf.read_manifest(role_dir)


def _arch(**overrides) -> ModelArchitecture:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 300,
    }
    return ModelArchitecture.from_hf_config({**cfg, **overrides})


def test_fingerprint_mismatch_names_the_fields_and_what_to_do():
    from megarl.checkpoint.role import check_fingerprint, fingerprint

    meta = {"architecture": fingerprint(_arch())}
    check_fingerprint(meta, _arch(), "ckpt/step_4/actor", "m")  # same model: fine
    with pytest.raises(CheckpointError) as e:
        check_fingerprint(
            meta, _arch(hidden_size=128, vocab_size=400), "checkpoints/step_4/actor", "/models/big"
        )
    message = str(e.value)
    assert "checkpoints/step_4/actor was saved from a model with hidden_size 64" in message
    assert "vocab_size 300" in message and "/models/big) has hidden_size 128" in message
    assert "num_hidden_layers" not in message and "trainer.resume" in message
    with pytest.raises(CheckpointError, match="head lm"):
        check_fingerprint(meta, _arch().with_scalar_head(), "c", "m")


def test_rng_state_round_trips_through_json_and_safetensors(tmp_path):
    from megarl.checkpoint import rng_state

    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    generator = torch.Generator().manual_seed(6)
    rng_state.write_rank_state(tmp_path, 1, {"tp": 1}, {"sampling_step": 9, "gen": generator.get_state()})
    expected = [random.random(), np.random.rand(), torch.rand(2)]
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    info, tensors = rng_state.read_rank_state(tmp_path, 1)
    assert info["layout"] == {"tp": 1}
    extra = rng_state.restore(info, tensors)
    assert [random.random(), np.random.rand()] == expected[:2] and torch.equal(torch.rand(2), expected[2])
    assert extra["sampling_step"] == 9 and torch.equal(extra["gen"], generator.get_state())
    json.loads((tmp_path / "rng" / "rank_1.json").read_text())  # plain JSON, no pickle
    (tmp_path / "rng" / "rank_1.json").write_text("{")
    with pytest.raises(CheckpointError, match="rank_1.json is corrupt"):
        rng_state.read_rank_state(tmp_path, 1)


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo owned",))


def test_dcp_metadata_unpickler_refuses_code_and_reads_metadata():
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    from megarl.checkpoint.safe_load import _MetadataUnpickler

    meta = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                TensorProperties(dtype=torch.float32),
                torch.Size([2, 3]),
                [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 3]))],
            )
        }
    )
    loaded = _MetadataUnpickler(io.BytesIO(pickle.dumps(meta))).load()
    assert loaded.state_dict_metadata["w"].size == torch.Size([2, 3])
    with pytest.raises(
        pickle.UnpicklingError, match="refusing to load posix.system|refusing to load os.system"
    ):
        _MetadataUnpickler(io.BytesIO(pickle.dumps(_Evil()))).load()


def test_no_code_unpickling_forces_weights_only_torch_load(tmp_path):
    from megarl.checkpoint.safe_load import no_code_unpickling

    path = tmp_path / "evil.pt"
    torch.save(_Evil(), path)
    with no_code_unpickling(), pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=False)
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
