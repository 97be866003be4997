"""TP layouts of megatron parameters: shard/unshard are inverses, and gate/up follow megatron's order."""

import pytest
import torch

from megarl.distributed.param_kind import ParamKind
from megarl.models.convert.sharding import shard, unshard

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", [k for k in ParamKind if k is not ParamKind.VOCAB])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_unshard_inverts_shard(kind, tp):
    full = torch.randn(16, 8)
    shards = [shard(kind, full, r, tp) for r in range(tp)]
    assert torch.equal(unshard(kind, shards), full)


def test_gate_up_shard_holds_its_gate_then_its_up_rows():
    gate, up = torch.arange(4.0).unsqueeze(1), torch.arange(10.0, 14.0).unsqueeze(1)
    second = shard("gate_up", torch.cat([gate, up]), tp_rank=1, tp=2)
    assert second.flatten().tolist() == [2.0, 3.0, 12.0, 13.0]


def test_vocab_pads_rows_with_zeros_and_unshard_drops_them():
    full = torch.randn(1001, 4)
    shards = [shard("vocab", full, r, 2, padded_rows=1024) for r in range(2)]
    assert [s.shape[0] for s in shards] == [512, 512]
    assert torch.equal(shards[1][-23:], torch.zeros(23, 4))
    assert torch.equal(unshard("vocab", shards, vocab_size=1001), full)


def test_row_parallel_splits_input_features():
    full = torch.arange(8.0).reshape(2, 4)
    assert shard("row", full, 1, 2).tolist() == [[2.0, 3.0], [6.0, 7.0]]


def test_unknown_kind_is_rejected():
    with pytest.raises(ValueError, match="unknown parameter kind"):
        shard("diagonal", torch.zeros(2, 2), 0, 1)
