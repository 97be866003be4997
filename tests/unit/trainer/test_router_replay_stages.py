"""MoE routing replay in the step graph: R3's routes come from generate and go to old_log_prob, the
reference and the update; R2's are written by old_log_prob and read by the update and the reference;
old_log_prob logs the trainer's disagreement with the engine (an independent count) and the route bytes."""

from types import SimpleNamespace

import pytest
import torch

from megarl.config import load_config
from megarl.protocol import Batch, Col
from megarl.rewards import RewardComputer
from megarl.trainer.dataflow import StepContext
from megarl.trainer.rl_stages import build_rl_dataflow, old_log_prob_stage
from megarl.workers.routes import LIVE_ROUTES

pytestmark = pytest.mark.unit


def _flow(mode: str, *overrides: str, actor=None):
    cfg = load_config(
        None,
        [
            "algorithm.name=grpo",
            "rollout.n=4",
            "algorithm.use_kl_loss=true",
            f"actor.router_replay.mode={mode}",
            *overrides,
        ],
        check_paths=False,
    )
    roles = SimpleNamespace(actor=actor or object(), ref=object(), critic=None, reward_model=None)
    flow, _ = build_rl_dataflow(cfg, roles, RewardComputer.from_config(cfg, None))
    return flow


def test_r3_routes_flow_from_the_engine_to_every_forward():
    flow = _flow("R3")
    assert Col.ROUTED_EXPERTS in flow["generate"].writes
    for stage in ("old_log_prob", "ref_log_prob", "update_actor"):
        assert Col.ROUTED_EXPERTS in flow[stage].reads, stage
    assert Col.ROUTED_EXPERTS not in flow["old_log_prob"].writes


def test_r2_routes_are_recorded_by_the_old_log_prob_pass():
    flow = _flow("R2")
    assert Col.ROUTED_EXPERTS not in flow["generate"].writes
    assert Col.ROUTED_EXPERTS in flow["old_log_prob"].writes
    assert (
        Col.ROUTED_EXPERTS in flow["update_actor"].reads and Col.ROUTED_EXPERTS in flow["ref_log_prob"].reads
    )


def test_without_replay_no_stage_touches_routes():
    flow = _flow("disabled")
    assert all(Col.ROUTED_EXPERTS not in s.reads + s.writes for s in flow.stages)


class _Actor:
    def __init__(self, live: torch.Tensor) -> None:
        self.live, self.seen = live, None

    def log_prob(self, batch: Batch) -> Batch:
        self.seen = batch
        n, width = batch[Col.RESPONSES].shape
        return Batch(
            {
                Col.OLD_LOG_PROBS: torch.zeros(n, width),
                Col.ENTROPY: torch.ones(n, width),
                LIVE_ROUTES: self.live,
            }
        )


def test_r3_old_log_prob_logs_how_often_the_trainer_would_route_otherwise():
    n, prompt, width, layers = 2, 2, 3, 2
    mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    engine = torch.tensor([[0, 1], [2, 3]], dtype=torch.int16).expand(n, prompt + width, layers, 2).clone()
    engine[~mask.bool()] = -1
    live = engine.clone()
    live[0, 1, 0] = torch.tensor([1, 0])  # the same experts, another order: agrees
    live[1, 2, 1] = torch.tensor([0, 3])  # another expert in layer 1 of one token
    live[1, 4] = torch.tensor([3, 1])  # both layers of another token
    batch = Batch(
        {
            Col.INPUT_IDS: torch.ones(n, prompt + width, dtype=torch.long),
            Col.ATTENTION_MASK: mask,
            Col.RESPONSES: torch.ones(n, width, dtype=torch.long),
            Col.RESPONSE_MASK: mask[:, prompt:].float(),
            Col.ROUTED_EXPERTS: engine,
        }
    )
    actor = _Actor(live)
    ctx = StepContext(step=1)
    out = old_log_prob_stage(actor, router_replay="R3").run(ctx, batch)
    assert Col.ROUTED_EXPERTS in actor.seen.tensors.keys()  # the engine's routes went to the actor
    assert LIVE_ROUTES not in out.tensors.keys()
    real_tokens, real_pairs = int(mask.sum()), int(mask.sum()) * layers
    assert ctx.metrics["router_replay/disagreement_token_share"] == pytest.approx(2 / real_tokens)
    assert ctx.metrics["router_replay/disagreement_layer_token_share"] == pytest.approx(3 / real_pairs)
    assert ctx.metrics["router_replay/route_bytes"] == engine.numel() * 2


def test_a_fused_update_logs_the_route_bytes_it_replays():
    class Actor:
        def update(self, batch: Batch) -> dict:
            self.seen = batch
            return {"grad_norm": 1.0}

    actor = Actor()
    flow = _flow("R3", "algorithm.old_log_prob=fused", "algorithm.ppo_mini_batch_size=64", actor=actor)
    assert "old_log_prob" not in flow.names and Col.ROUTED_EXPERTS in flow["update_actor"].reads
    routes = torch.zeros(2, 5, 3, 2, dtype=torch.int16)
    batch = Batch(
        {
            Col.INPUT_IDS: torch.ones(2, 5, dtype=torch.long),
            Col.ATTENTION_MASK: torch.ones(2, 5, dtype=torch.long),
            Col.RESPONSES: torch.ones(2, 3, dtype=torch.long),
            Col.RESPONSE_MASK: torch.ones(2, 3),
            Col.ROLLOUT_LOG_PROBS: torch.zeros(2, 3),
            Col.ADVANTAGES: torch.zeros(2, 3),
            Col.REF_LOG_PROBS: torch.zeros(2, 3),
            Col.ROUTED_EXPERTS: routes,
        }
    )
    ctx = StepContext(step=1)
    flow["update_actor"].run(ctx, batch)
    assert torch.equal(actor.seen[Col.ROUTED_EXPERTS], routes)
    assert ctx.metrics["router_replay/route_bytes"] == routes.numel() * 2
