"""Routing replay on megatron-core's own TopKRouter (single process, gloo): forced experts, gating weights
against an independent computation, the -1 fallback, gradients, recording; and the route lay-out helpers
against megarl's micro-batches."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from megarl.models.moe_replay import (
    disagreement,
    microbatch_routes,
    moe_layer_numbers,
    recording,
    replaying,
    row_routes,
    rows_of_microbatch,
    split_rows,
)
from megarl.workers.sequences import Sequences, build_microbatch

EXPERTS, TOPK, HIDDEN, TOKENS, LAYERS = 4, 2, 8, 12, 2


@pytest.fixture(scope="module")
def group():
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    if created:
        dist.destroy_process_group()


def _model(group, pre_softmax: bool = False) -> torch.nn.ModuleList:
    """LAYERS MoE routers as a model chunk holds them (layer numbers 1..LAYERS)."""
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.transformer.moe.router import TopKRouter
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_moe_experts=EXPERTS,
        moe_router_topk=TOPK,
        moe_router_pre_softmax=pre_softmax,
        moe_router_dtype="fp32",
        use_cpu_initialization=True,
    )
    pg = ProcessGroupCollection(tp=group, cp=group, tp_cp=group, tp_dp_cp=group)
    torch.manual_seed(0)
    routers = torch.nn.ModuleList(TopKRouter(config, pg) for _ in range(LAYERS))
    for number, router in enumerate(routers, start=1):
        router.set_layer_number(number)
    return routers


def _route(model, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(logits, probs, routing_map) per layer. Router.gating moves CPU weights to CUDA, so the logits
    are the same linear computed here (the router's weight keeps its gradient)."""
    out = []
    for router in model:
        logits = torch.nn.functional.linear(x, router.weight).view(TOKENS, 1, EXPERTS)
        probs, routing_map = router.routing(logits)
        out.append((logits.view(TOKENS, EXPERTS), probs, routing_map))
    return out


def _random_routes(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    perms = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOPK] for _ in range(TOKENS * LAYERS)])
    return perms.view(TOKENS, LAYERS, TOPK).to(torch.int16)


def _one_hot(routes: torch.Tensor) -> torch.Tensor:
    return torch.zeros(len(routes), EXPERTS, dtype=torch.bool).scatter(1, routes.long(), True)


def test_record_gives_the_live_routes(group):
    model = _model(group)
    x = torch.randn(TOKENS, HIDDEN)
    with recording(model) as routes:
        out = _route(model, x)
        recorded = routes.recorded()
    assert recorded.dtype == torch.int16 and recorded.shape == (TOKENS, LAYERS, TOPK)
    for layer, (logits, _, routing_map) in enumerate(out):
        assert torch.equal(recorded[:, layer].long(), torch.topk(logits, TOPK, dim=1).indices)
        assert torch.equal(_one_hot(recorded[:, layer]), routing_map)
    assert all(router.router_replay is None for router in model)  # restored


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_replay_forces_experts_and_recomputes_the_gating_weights(group, norm_topk_prob):
    # Qwen3-MoE's norm_topk_prob=True is megatron's moe_router_pre_softmax=False, and False is True
    model = _model(group, pre_softmax=not norm_topk_prob)
    x = torch.randn(TOKENS, HIDDEN)
    routes = _random_routes(1)
    with replaying(model, routes):
        out = _route(model, x)
    for layer, (logits, probs, routing_map) in enumerate(out):
        forced = routes[:, layer].long()
        assert torch.equal(routing_map, _one_hot(forced))
        # Qwen3-MoE's gate (transformers): softmax over all experts, the chosen ones, renormalised
        weights = torch.softmax(logits.double(), dim=-1).gather(1, forced)
        if norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        torch.testing.assert_close(probs.gather(1, forced).double(), weights, rtol=0, atol=1e-6)
        assert float(probs.detach().masked_fill(routing_map, 0).abs().max()) == 0.0


def test_missing_routes_fall_back_to_the_live_router(group):
    model = _model(group)
    x = torch.randn(TOKENS, HIDDEN)
    live = _route(model, x)
    routes = _random_routes(2)
    routes[3, 0] = -1  # token 3 in layer 0: no route
    routes[5, 1, 1] = -1  # token 5 in layer 1: half a route is none
    with replaying(model, routes):
        out = _route(model, x)
    for layer, token in ((0, 3), (1, 5)):
        assert torch.equal(out[layer][2][token], live[layer][2][token])
        assert torch.equal(out[layer][1][token], live[layer][1][token])
    others = torch.ones(TOKENS, dtype=torch.bool)
    others[3] = False
    assert torch.equal(out[0][2][others], _one_hot(routes[others, 0]))


def test_the_router_keeps_its_gradient(group):
    model = _model(group)
    x = torch.randn(TOKENS, HIDDEN)
    routes = _random_routes(3)
    target = torch.randn(TOKENS, EXPERTS)
    with replaying(model, routes):
        (_, probs, _) = _route(model, x)[0]
    (probs * target).sum().backward()
    weight = model[0].weight.detach().clone().requires_grad_()
    forced = routes[:, 0].long()
    ref = torch.softmax(torch.nn.functional.linear(x, weight).gather(1, forced), dim=-1)
    (ref * target.gather(1, forced)).sum().backward()
    assert float(weight.grad.abs().max()) > 0
    torch.testing.assert_close(model[0].weight.grad, weight.grad, rtol=0, atol=1e-6)


def test_replaying_the_recorded_routes_is_bitwise_the_live_forward(group):
    model = _model(group)
    x = torch.randn(TOKENS, HIDDEN)
    with recording(model) as routes:
        live = _route(model, x)
        recorded = routes.recorded()
    with replaying(model, recorded):
        replayed = _route(model, x)
    for (_, p_live, m_live), (_, p_replay, m_replay) in zip(live, replayed):
        assert torch.equal(p_live, p_replay) and torch.equal(m_live, m_replay)


def test_a_pipeline_stage_replays_and_records_its_own_layers_by_global_index(group):
    stage = torch.nn.ModuleList([_model(group)[1]])  # the second stage of PP2: MoE layer 1 only
    x = torch.randn(TOKENS, HIDDEN)
    with recording(stage) as routes:
        logits, _, _ = _route(stage, x)[0]
        recorded = routes.recorded()
    assert recorded.shape == (TOKENS, LAYERS, TOPK)
    assert bool((recorded[:, 0] == -1).all())
    assert torch.equal(recorded[:, 1].long(), torch.topk(logits, TOPK, dim=1).indices)
    routes = _random_routes(5)
    with replaying(stage, routes):
        _, _, routing_map = _route(stage, x)[0]
    assert torch.equal(routing_map, _one_hot(routes[:, 1]))


def test_disagreement_counts_tokens_routed_to_another_expert_set():
    a = _random_routes(6)
    b = a.flip(-1).clone()  # the same experts in another order: no disagreement
    b[0, 1] = torch.tensor([x for x in range(EXPERTS) if x not in a[0, 1].tolist()][:TOPK])
    b[1, 0] = -1  # unknown: left out
    shares = disagreement(a, b)
    assert shares["layer_token_share"] == pytest.approx(1 / (TOKENS * LAYERS - 1))
    assert shares["token_share"] == pytest.approx(1 / TOKENS)


def test_bad_routes_are_refused(group):
    model = _model(group)
    twice = _random_routes(4)
    twice[0, 0] = torch.tensor([1, 1])
    with pytest.raises(ValueError, match="one expert twice"):
        with replaying(model, twice):
            pass
    with pytest.raises(ValueError, match="MoE layers"):
        with replaying(model, _random_routes(4)[:, :1]):
            pass
    with replaying(model, _random_routes(4)[:5]):
        with pytest.raises(ValueError, match="microbatch_routes"):
            _route(model, torch.randn(TOKENS, HIDDEN))


def test_moe_layer_numbers_follow_moe_layer_freq():
    class Config:
        num_layers, moe_layer_freq = 6, 2

    assert moe_layer_numbers(Config) == [1, 3, 5]
    Config.moe_layer_freq = [0, 1, 1, 0, 1, 1]  # DeepSeek-style dense first layer
    assert moe_layer_numbers(Config) == [2, 3, 5, 6]


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_microbatch_routes_follow_the_token_order(mode):
    # rows of a rollout batch: left-padded prompt ‖ right-padded response, routes aligned with input_ids;
    # each real token's routes hold its token id, so a laid-out route can be checked against input_ids
    lengths = [(2, 3), (3, 1), (1, 2), (3, 3)]  # (prompt, response) tokens per row
    P, R, layers = 3, 3, 2
    input_ids = torch.zeros(len(lengths), P + R, dtype=torch.long)
    mask = torch.zeros(len(lengths), P + R, dtype=torch.long)
    for i, (p, r) in enumerate(lengths):
        mask[i, P - p : P + r] = 1
        input_ids[i, P - p : P + r] = torch.arange(1, p + r + 1) + 10 * i
    routed = torch.where(mask.bool(), input_ids, -1)[..., None, None].expand(-1, -1, layers, TOPK)
    rows = row_routes(routed.to(torch.int16), mask)
    ranks = split_rows(rows, 2)
    assert [len(part) for part in ranks] == [2, 2] and ranks[1][0] is rows[2]

    seqs = Sequences(
        tokens=[input_ids[i][mask[i].bool()] for i in range(len(lengths))],
        prompt_lens=[p for p, _ in lengths],
        loss_mask=torch.ones(len(lengths), R),
    )
    batch_rows, length = ([0, 1, 3], 16) if mode == "pack" else ([1, 2], 6)
    mb = build_microbatch(seqs, batch_rows, mode, length, rows_per_mb=3)
    out = microbatch_routes(rows, mb)
    n_rows = mb["input_ids"].shape[0]
    assert out.shape == (n_rows * length, layers, TOPK) and out.dtype == torch.int16
    # megatron's tokens are [length, rows] flattened: position-major
    expected = mb["input_ids"].t().reshape(-1).masked_fill(mb["input_ids"].t().reshape(-1) == 0, -1)
    assert torch.equal(out[:, 0, 0].long(), expected)
    assert torch.equal(out[:, 1, 1].long(), expected)
    back = rows_of_microbatch(out, mb, [len(t) for t in rows])
    assert sorted(back) == batch_rows and all(torch.equal(back[r], rows[r]) for r in batch_rows)
