"""The route column of a rollout (megarl.rollout.vllm_moe): recorded routes by token position placed under
input_ids, and engine request ids matched to the samples of vLLM's outputs."""

from types import SimpleNamespace

import pytest
import torch

from megarl.rollout.vllm_moe import NO_ROUTE, request_key, routes_column, sample_key, sample_routes

pytestmark = pytest.mark.unit

L, K = 3, 2


def recorded(positions: int, start: int = 0) -> torch.Tensor:
    """Routes whose every entry names its position (plus `start`), budget 2 positions longer than needed."""
    r = torch.full((positions + 2, L, K), NO_ROUTE, dtype=torch.int16)
    r[:positions] = (torch.arange(positions, dtype=torch.int16) + start)[:, None, None]
    return r


def test_routes_sit_under_their_tokens_and_the_rest_is_the_sentinel():
    # row 0: prompt 2 tokens, response 3 (4 positions forwarded); row 1: prompt 4, response 1; row 2: none
    out = routes_column([recorded(4), recorded(4, start=10), None], [2, 4, 3], [3, 1, 2], 4, 3, L, K)
    assert out.shape == (3, 7, L, K) and out.dtype == torch.int16
    expected = torch.full((3, 7), NO_ROUTE, dtype=torch.int16)
    expected[0, 2:6] = torch.tensor([0, 1, 2, 3])  # prompt at columns 2-3, response 4-5 (its last: 6, -1)
    expected[1, 0:4] = torch.tensor([10, 11, 12, 13])  # the one response token is the last: never forwarded
    assert torch.equal(out[..., 0, 0], expected)
    assert torch.equal(out, expected[:, :, None, None].expand(3, 7, L, K))


def test_engine_request_ids_map_to_their_samples():
    assert request_key("7-1a2b3c4d") == "7" and request_key("1_7-1a2b3c4d") == "1_7"
    assert sample_key("7", 0, 1) == "7" and sample_key("7", 1, 2) == "1_7"
    a, b, c = recorded(1), recorded(1, 5), recorded(1, 9)
    outputs = [
        SimpleNamespace(request_id="3", outputs=[SimpleNamespace(index=1), SimpleNamespace(index=0)]),
        SimpleNamespace(request_id="4", outputs=[SimpleNamespace(index=0), SimpleNamespace(index=1)]),
    ]
    got = sample_routes(outputs, {"1_3-aaaaaaaa": b, "0_3-bbbbbbbb": a, "0_4-cccccccc": c})
    assert got[0] is a and got[1] is b and got[2] is c and got[3] is None
    single = [SimpleNamespace(request_id="12", outputs=[SimpleNamespace(index=0)])]
    assert sample_routes(single, {"12-dddddddd": a})[0] is a


def test_cpu_experts_under_expert_parallelism_get_local_ids_and_no_weight_for_other_ranks(monkeypatch):
    """vLLM 0.32's CPU kernel indexes the rank's local experts with the ids it is given and ignores the
    expert map: the shim hands it local ids, another rank's expert as id 0 with weight 0."""
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    from megarl.rollout.vllm_moe import local_expert_ids_on_cpu

    seen = {}

    def kernel(self, *args, topk_weights, topk_ids, expert_map, **kwargs):
        seen.update(topk_weights=topk_weights, topk_ids=topk_ids, expert_map=expert_map, rest=(args, kwargs))

    monkeypatch.setattr(CPUUnquantizedExperts, "apply", kernel)
    local_expert_ids_on_cpu()
    local_expert_ids_on_cpu()  # idempotent: wrapped once
    expert_map = torch.tensor([-1, -1, 0, 1], dtype=torch.int32)  # rank 1 of 2 holds experts 2 and 3
    ids = torch.tensor([[2, 0], [3, 2], [1, 0]], dtype=torch.int32)
    weights = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.9, 0.1]])
    CPUUnquantizedExperts.apply(
        "self", "output", topk_weights=weights, topk_ids=ids, expert_map=expert_map, activation="silu"
    )
    assert torch.equal(seen["topk_ids"], torch.tensor([[0, 0], [1, 0], [0, 0]], dtype=torch.int32))
    assert torch.equal(seen["topk_weights"], torch.tensor([[0.6, 0.0], [0.7, 0.3], [0.0, 0.0]]))
    assert seen["expert_map"] is None and seen["rest"] == (("output",), {"activation": "silu"})
