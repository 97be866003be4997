"""Planned safetensors shards: HF's names and index, readable by safetensors, written tensor by tensor."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from megarl.models.convert.safetensors_shards import (
    ShardWriter,
    TensorSpec,
    parse_size,
    plan_shards,
    write_index,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text, size",
    [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("1.5kb", 1500), ("123", 123)],
)
def test_sizes_parse_like_save_pretrained(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "5 TB", "-1MB", "0", "lots"])
def test_bad_sizes_say_what_is_accepted(text):
    with pytest.raises(ValueError, match="like '5GB'"):
        parse_size(text)


def specs(tensors):
    return [TensorSpec.of(n, t) for n, t in tensors.items()]


def test_groups_never_share_a_shard_and_big_tensors_get_their_own():
    a = {"a0": torch.zeros(100), "big": torch.zeros(1000), "a1": torch.zeros(10)}
    b = {"b0": torch.zeros(10)}
    plan = plan_shards([specs(a), specs(b)], max_shard_bytes=500)
    assert [[t.name for t in s.tensors] for s in plan.shards] == [["a0"], ["big"], ["a1"], ["b0"]]
    assert [s.group for s in plan.shards] == [0, 0, 0, 1]
    assert plan.shards[0].file == "model-00001-of-00004.safetensors"
    assert plan_shards([specs(a)], 10**6).shards[0].file == "model.safetensors"


def test_streamed_shards_load_back_exactly_with_hf_index(tmp_path):
    tensors = {
        "w.bf16": torch.randn(3, 5).to(torch.bfloat16),  # odd byte count before a wider dtype
        "w.f32": torch.randn(64, 64),
        "w.i64": torch.arange(7),
        "w.f16": torch.randn(33).half(),
        "scalar": torch.tensor(2.5),
    }
    plan = plan_shards([specs(tensors)], max_shard_bytes=10_000)
    writer = ShardWriter(tmp_path, plan)
    for name in reversed(list(tensors)):  # any order: every tensor has its planned offset
        writer.write(name, tensors[name])
    writer.close()
    write_index(tmp_path, plan)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) == 3 and files[-1] == "model-00003-of-00003.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    loaded = {}
    for f in files:
        with safe_open(tmp_path / f, framework="pt") as handle:
            assert handle.metadata() == {"format": "pt"}
        loaded.update(load_file(tmp_path / f))
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name


def test_writer_refuses_what_was_not_planned(tmp_path):
    plan = plan_shards([[TensorSpec("a", (2,), torch.float32)]], 100)
    writer = ShardWriter(tmp_path, plan)
    with pytest.raises(ValueError, match=r"planned \(2,\) torch.float32"):
        writer.write("a", torch.zeros(3))
    with pytest.raises(KeyError, match="not planned"):
        writer.write("b", torch.zeros(2))
    with pytest.raises(ValueError, match="never arrived"):
        writer.close()
