"""Batch: construction checks, row ops, dispatch helpers (chunk/pad/concat) and pickle transport."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from megarl.protocol import Batch, Col

pytestmark = pytest.mark.unit


def make_batch(n: int = 6) -> Batch:
    tensors = {
        "input_ids": torch.arange(n * 4).reshape(n, 4),
        "logp": torch.randn(n, 4),
        "mask": torch.arange(n * 4).reshape(n, 4) % 3 == 0,
        "score": torch.randn(n).to(torch.bfloat16),
    }
    prompts = np.array([f"prompt {i}" for i in range(n)], dtype=object)
    info = np.empty(n, dtype=object)
    info[:] = [{"id": i, "tags": ["a"] * i} for i in range(n)]
    return Batch(tensors, {"prompt": prompts, "info": info}, {"temperature": 0.7, "step": 3})


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert len(a) == len(b)
    assert a.keys() == b.keys()
    for key in a.tensors.keys():
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert torch.equal(a[key].reshape(-1).view(torch.uint8), b[key].reshape(-1).view(torch.uint8)), key
    for key in a.non_tensors:
        assert list(a[key]) == list(b[key]), key
    assert a.meta == b.meta


def test_construction_from_dict_and_tensordict():
    b = make_batch(5)
    assert len(b) == 5
    assert b.keys() == ["input_ids", "logp", "mask", "score", "prompt", "info"]
    assert isinstance(b.tensors, TensorDict) and b.tensors.batch_size == torch.Size([5])
    td = TensorDict({"x": torch.zeros(3, 2)}, batch_size=[3])
    assert len(Batch(td)) == 3
    assert len(Batch(non_tensors={"s": ["a", "b"]})) == 2
    assert Batch(non_tensors={"s": ["a", "b"]})["s"].dtype == object


def test_empty_batch_has_no_rows():
    assert len(Batch()) == 0
    assert len(Batch(meta={"step": 1})) == 0
    assert Batch().keys() == []


def test_mismatched_tensor_length_names_column():
    with pytest.raises(ValueError, match=r"'b' has 3 rows but the batch has N=4"):
        Batch({"a": torch.zeros(4), "b": torch.zeros(3)})


def test_mismatched_non_tensor_length_names_column():
    with pytest.raises(ValueError, match=r"'s' has 2 rows but the batch has N=4"):
        Batch({"a": torch.zeros(4)}, {"s": np.array(["x", "y"], dtype=object)})


def test_scalar_tensor_and_2d_non_tensor_rejected():
    with pytest.raises(ValueError, match="scalar"):
        Batch({"a": torch.tensor(1.0)})
    with pytest.raises(ValueError, match="1-D"):
        Batch(non_tensors={"s": np.zeros((2, 2), dtype=object)})


def test_getitem_column_and_missing_key():
    b = make_batch(4)
    assert torch.equal(b["input_ids"], torch.arange(16).reshape(4, 4))
    assert b["prompt"][2] == "prompt 2"
    assert "logp" in b and "prompt" in b and "nope" not in b
    with pytest.raises(KeyError, match="nope"):
        b["nope"]


def test_slice_rows():
    b = make_batch(6)
    s = b[2:5]
    assert len(s) == 3
    assert torch.equal(s["input_ids"], b["input_ids"][2:5])
    assert list(s["prompt"]) == ["prompt 2", "prompt 3", "prompt 4"]
    assert s.meta == b.meta and s.meta is not b.meta


@pytest.mark.parametrize("index", [torch.tensor([4, 0, 4]), [4, 0, 4], np.array([4, 0, 4])])
def test_index_rows(index):
    b = make_batch(6)
    s = b[index]
    assert torch.equal(s["logp"], b["logp"][[4, 0, 4]])
    assert list(s["prompt"]) == ["prompt 4", "prompt 0", "prompt 4"]
    assert [d["id"] for d in s["info"]] == [4, 0, 4]


def test_bool_mask_and_int_rows():
    b = make_batch(4)
    s = b[torch.tensor([True, False, True, False])]
    assert list(s["prompt"]) == ["prompt 0", "prompt 2"]
    assert list(b[-1]["prompt"]) == ["prompt 3"]
    with pytest.raises(TypeError, match="integers"):
        b[torch.tensor([0.5])]


def test_setitem_adds_and_checks_columns():
    b = make_batch(4)
    b["adv"] = torch.ones(4)
    b["answer"] = ["a", "b", "c", "d"]
    assert b.keys()[-1] == "answer" and "adv" in b.tensors.keys()
    with pytest.raises(ValueError, match=r"'bad' has 3 rows but the batch has N=4"):
        b["bad"] = torch.ones(3)
    empty = Batch()
    empty["x"] = torch.zeros(5)
    assert len(empty) == 5


def test_select_columns_and_meta():
    b = make_batch(4)
    s = b.select(["logp", "prompt"], meta_keys=["step"])
    assert s.keys() == ["logp", "prompt"]
    assert s.meta == {"step": 3}
    assert b.select(["logp"]).meta == b.meta
    with pytest.raises(KeyError, match="missing"):
        b.select(["missing"])


def test_union_merges_columns_and_meta():
    b = make_batch(4)
    left = b.select(["input_ids", "prompt"], meta_keys=["step"])
    right = b.select(["input_ids", "logp", "info"], meta_keys=["temperature"])
    u = left.union(right)
    assert sorted(u.keys()) == sorted(["input_ids", "logp", "prompt", "info"])
    assert u.meta == {"step": 3, "temperature": 0.7}
    assert len(Batch().union(b)) == 4
    nan = Batch({"logp": torch.tensor([float("nan"), 1.0])})
    assert nan.union(nan.select(["logp"])).keys() == ["logp"]


def test_union_conflicts_raise():
    b = make_batch(4)
    other = Batch({"logp": torch.zeros(4, 4)})
    with pytest.raises(ValueError, match="'logp' differs"):
        b.union(other)
    with pytest.raises(ValueError, match="4 and 3 rows"):
        b.union(make_batch(3))
    with pytest.raises(ValueError, match="meta 'step' differs"):
        b.union(Batch(meta={"step": 4}))


def test_chunk_then_concat_is_identity():
    b = make_batch(6)
    parts = b.chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert list(parts[1]["prompt"]) == ["prompt 2", "prompt 3"]
    assert_batches_equal(Batch.concat(parts), b)


def test_chunk_not_divisible_says_to_pad():
    with pytest.raises(ValueError, match=r"pad_to_multiple\(4\)"):
        make_batch(6).chunk(4)


def test_concat_mismatched_columns_raises():
    b = make_batch(4)
    with pytest.raises(ValueError, match="columns"):
        Batch.concat([b, b.select(["logp"])])
    with pytest.raises(ValueError, match="at least one"):
        Batch.concat([])


def test_concat_takes_meta_from_first():
    a, c = make_batch(2), make_batch(3)
    c.meta["step"] = 99
    assert Batch.concat([a, c]).meta == a.meta


def test_pad_unpad_round_trip():
    b = make_batch(10)
    padded, pad = b.pad_to_multiple(4)
    assert pad == 2 and len(padded) == 12
    assert list(padded["prompt"][10:]) == ["prompt 0", "prompt 1"]
    assert torch.equal(padded["logp"][10:], b["logp"][:2])
    assert [len(c) for c in padded.chunk(4)] == [3, 3, 3, 3]
    assert_batches_equal(padded.unpad(pad), b)
    same, zero = b.pad_to_multiple(5)
    assert zero == 0 and len(same) == 10


def test_pad_cycles_when_pad_exceeds_rows():
    padded, pad = make_batch(2).pad_to_multiple(7)
    assert pad == 5
    assert [p.split()[1] for p in padded["prompt"]] == ["0", "1", "0", "1", "0", "1", "0"]


def test_repeat_interleave_and_tile_order():
    b = Batch({"x": torch.tensor([1, 2])}, {"s": ["a", "b"]})
    assert b.repeat(2)["x"].tolist() == [1, 1, 2, 2]
    assert list(b.repeat(2)["s"]) == ["a", "a", "b", "b"]
    assert b.repeat(2, interleave=False)["x"].tolist() == [1, 2, 1, 2]
    assert list(b.repeat(3, interleave=False)["s"]) == ["a", "b", "a", "b", "a", "b"]


def test_reorder_returns_new_batch():
    b = make_batch(4)
    r = b.reorder(torch.tensor([3, 1, 0, 2]))
    assert list(r["prompt"]) == ["prompt 3", "prompt 1", "prompt 0", "prompt 2"]
    assert list(b["prompt"]) == ["prompt 0", "prompt 1", "prompt 2", "prompt 3"]
    with pytest.raises(ValueError, match="permutation"):
        b.reorder([0, 0, 1, 2])


def test_rows_yields_single_row_batches():
    rows = list(make_batch(3).rows())
    assert [len(r) for r in rows] == [1, 1, 1]
    assert rows[2]["prompt"][0] == "prompt 2"


def test_to_device_keeps_other_columns():
    b = make_batch(3).to("cpu")
    assert b["logp"].device.type == "cpu"
    assert list(b["prompt"]) == ["prompt 0", "prompt 1", "prompt 2"]


def test_pickle_round_trip_is_bit_exact():
    b = make_batch(7)
    b["nan"] = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45, 0.0, 1.0, 2.0])
    restored = pickle.loads(pickle.dumps(b))
    assert_batches_equal(restored, b)
    assert restored["info"][3] == {"id": 3, "tags": ["a"] * 3}


def test_pickle_of_views_and_empty_batches():
    b = make_batch(8)[torch.tensor([5, 1])].chunk(2)[1]
    assert_batches_equal(pickle.loads(pickle.dumps(b)), b)
    assert_batches_equal(pickle.loads(pickle.dumps(Batch(meta={"a": 1}))), Batch(meta={"a": 1}))
    zero_rows = make_batch(4)[:0]
    assert len(pickle.loads(pickle.dumps(zero_rows))) == 0


def test_pickle_packs_tensors_into_one_buffer():
    b = make_batch(4)
    state = b.__getstate__()
    assert isinstance(state["buffer"], np.ndarray) and state["buffer"].dtype == np.uint8
    assert [entry[0] for entry in state["layout"]] == list(b.tensors.keys())


def test_unpickle_of_read_only_buffer_is_writable():
    b = make_batch(3)
    state = b.__getstate__()
    state["buffer"].flags.writeable = False
    restored = Batch.__new__(Batch)
    restored.__setstate__(state)
    restored["logp"].add_(1)
    assert torch.equal(restored["logp"], b["logp"] + 1)


def test_column_names_are_spelled_like_their_constants():
    names = {k: v for k, v in vars(Col).items() if k.isupper()}
    assert names and all(value == key.lower() for key, value in names.items())
