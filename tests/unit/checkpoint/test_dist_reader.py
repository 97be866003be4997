"""Boxes of a torch.distributed.checkpoint read in one process: a layer of a stacked tensor, the unpadded
vocabulary rows (the real megatron layout is covered by tests/multiproc/test_convert.py)."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from megarl.checkpoint.dist_reader import Box, DistCheckpointReader

pytestmark = pytest.mark.unit


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_box_reads_one_layer_and_the_unpadded_rows(tmp_path):
    stacked = torch.randn(3, 8, 4)
    embedding = torch.randn(10, 4)
    dcp.save({"decoder.layers.w": stacked, "embedding.w": embedding}, checkpoint_id=tmp_path, no_dist=True)
    reader = DistCheckpointReader(tmp_path)
    assert reader.tensors["decoder.layers.w"] == ((3, 8, 4), torch.float32)
    boxes = [
        Box("decoder.layers.1.w", "decoder.layers.w", (1, 0, 0), (1, 8, 4), torch.float32, stacked=True),
        Box("embedding.w", "embedding.w", (0, 0), (7, 4), torch.float32, stacked=False),
    ]
    got = reader.read(boxes)
    assert torch.equal(got["decoder.layers.1.w"], stacked[1])
    assert torch.equal(got["embedding.w"], embedding[:7])
