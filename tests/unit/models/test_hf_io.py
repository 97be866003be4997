"""Streaming safetensors I/O: sharded writes come back through the index, tensor by tensor."""

import json

import pytest
import torch

from megarl.models.convert.hf_io import HFCheckpointReader, write_hf_weights

pytestmark = pytest.mark.unit


def test_sharded_write_reads_back_exactly(tmp_path):
    tensors = {f"w{i}": torch.randn(64, 64) for i in range(5)}  # 16 KiB each
    write_hf_weights(tmp_path, tensors.items(), max_shard_size=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    reader = HFCheckpointReader(tmp_path)
    assert sorted(reader.names()) == sorted(tensors)
    assert all(torch.equal(reader.get(n), t) for n, t in tensors.items())


def test_reader_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        HFCheckpointReader(tmp_path)
    write_hf_weights(tmp_path, [("a", torch.zeros(2))])
    with pytest.raises(KeyError, match="'b' is not in the checkpoint"):
        HFCheckpointReader(tmp_path).get("b")
