"""The driver-side RL stages on real Batches (advantages with in-reward KL, DAPO's group filter, rollout
correction, PF-PPO) and the stage graph each config builds."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from megarl.algorithms.advantages import scores_to_token_rewards
from megarl.config import load_config
from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch
from megarl.rewards import RewardComputer
from megarl.trainer.dataflow import Stage, StepContext
from megarl.trainer.rl_stages import (
    advantages_stage,
    balance_stage,
    build_rl_dataflow,
    pf_ppo_stage,
    rollout_correction_stage,
)
from megarl.trainer.scoring import DynamicSamplingError, filter_groups_stage


def _cfg(**algorithm) -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.algorithm.adv_estimator = "grpo"
    for key, value in algorithm.items():
        setattr(cfg.algorithm, key, value)
    return cfg


def _rollouts(scores: list[float], uids: list[int], width: int = 3) -> Batch:
    mask = torch.ones(len(scores), width)
    mask[0, 2] = 0  # a shorter first response
    s = torch.tensor(scores)
    return Batch(
        {
            "scores": s,
            "token_level_scores": scores_to_token_rewards(s, mask),
            "response_mask": mask,
            "uid": torch.tensor(uids),
        }
    )


def test_grpo_advantages_are_the_group_normalised_scores_on_every_response_token():
    stage, _ = advantages_stage(_cfg())
    ctx = StepContext(step=1)
    out = stage.run(ctx, _rollouts([1.0, 0.0, 0.5, 0.5], [7, 7, 9, 9]))
    by_hand = torch.tensor([0.5, -0.5]) / (torch.tensor([1.0, 0.0]).std() + 1e-6)
    assert torch.allclose(out["advantages"][0, :2], by_hand[0].expand(2))
    assert out["advantages"][0, 2] == 0  # padding
    assert torch.allclose(out["advantages"][1], by_hand[1].expand(3))
    assert torch.equal(out["advantages"][2:], torch.zeros(2, 3))  # an all-equal group teaches nothing
    assert "kl/mean" not in ctx.metrics


def test_kl_in_the_reward_is_subtracted_on_response_tokens_and_steers_the_coefficient():
    stage, kl_ctrl = advantages_stage(
        _cfg(use_kl_in_reward=True, kl_penalty="k1", kl_coef=0.1, kl_ctrl="adaptive", kl_target=0.01)
    )
    batch = _rollouts([1.0, 0.0], [1, 1])
    old = torch.full((2, 3), -1.0)
    ref = torch.full((2, 3), -1.5)  # k1 = old - ref = 0.5 on every token
    batch = Batch({**dict(batch.tensors.items()), "old_log_probs": old, "ref_log_probs": ref})
    ctx = StepContext(step=1)
    out = stage.run(ctx, batch)
    expected = batch["token_level_scores"] - 0.1 * 0.5 * batch["response_mask"]
    assert torch.allclose(out["token_level_rewards"], expected)
    assert ctx.metrics["kl/mean"] == pytest.approx(0.5) and ctx.metrics["kl/coef"] == pytest.approx(0.1)
    assert kl_ctrl.value > 0.1  # measured KL above target: the coefficient grows


def _filter_setup(limit: int = 5):
    cfg = _cfg()
    cfg.data.train_batch_size, cfg.rollout.n = 2, 2
    cfg.algorithm.filter_groups.max_num_gen_batches = limit
    batches = iter(
        [
            Batch({"raw": torch.tensor([3.0, 3.0, 1.0, 2.0]), "uid": torch.tensor([2, 2, 3, 3])}),
            Batch({"raw": torch.tensor([5.0, 6.0, 0.0, 0.0]), "uid": torch.tensor([4, 4, 5, 5])}),
        ]
    )
    score = Stage("reward", lambda ctx, b: {"scores": b["raw"]}, reads=("raw",), writes=("scores",))
    return cfg, (lambda: next(batches)), score


def test_dynamic_sampling_keeps_whole_varied_groups_and_generates_more_until_the_batch_is_full():
    cfg, more, score = _filter_setup()
    stage = filter_groups_stage(cfg, more, lambda: [score])
    first = Batch(
        {
            "raw": torch.tensor([1.0, 1.0, 0.0, 1.0]),
            "scores": torch.tensor([1.0, 1.0, 0.0, 1.0]),
            "uid": torch.tensor([0, 0, 1, 1]),
        }
    )
    ctx = StepContext(step=1)
    out = stage.run(ctx, first)
    assert out["uid"].tolist() == [1, 1, 3, 3]  # group 0 (all 1.0) and group 2 (all 3.0) dropped
    assert ctx.metrics["dynamic_sampling/gen_batches"] == 2
    assert ctx.metrics["dynamic_sampling/kept_group_frac"] == pytest.approx(2 / 4)


def test_dynamic_sampling_that_cannot_fill_the_batch_says_what_to_change():
    cfg, more, score = _filter_setup(limit=1)
    stage = filter_groups_stage(cfg, more, lambda: [score])
    flat = Batch({"raw": torch.ones(4), "scores": torch.ones(4), "uid": torch.tensor([0, 0, 1, 1])})
    with pytest.raises(DynamicSamplingError, match="kept 0 of the 2 groups.*max_num_gen_batches"):
        stage.run(StepContext(step=1), flat)


GRPO = ["algorithm.name=grpo", "rollout.n=4"]


def _roles(**present):
    names = ("actor", "ref", "critic", "reward_model")
    return SimpleNamespace(**{n: (object() if n == "actor" or present.get(n) else None) for n in names})


@pytest.mark.parametrize(
    ("overrides", "roles", "stages"),
    [
        (GRPO, {}, "generate reward token_rewards old_log_prob advantages update_actor"),
        # one optimizer step per training step: auto fuses the old log-probs into the update's forward
        ([*GRPO, "data.train_batch_size=16"], {}, "generate reward token_rewards advantages update_actor"),
        (
            [*GRPO, "data.train_batch_size=16", "algorithm.old_log_prob=recompute"],
            {},
            "generate reward token_rewards old_log_prob advantages update_actor",
        ),
        (
            ["algorithm.name=ppo", "algorithm.use_kl_in_reward=true"],
            {"critic": 1, "ref": 1},
            "generate reward token_rewards old_log_prob ref_log_prob values advantages update_critic update_actor",
        ),
        (
            [*GRPO, "algorithm.rollout_correction.rollout_is=token", "algorithm.pf_ppo.enable=true"],
            {},
            "generate reward token_rewards old_log_prob rollout_correction advantages pf_ppo update_actor",
        ),
        (
            [*GRPO, "algorithm.rollout_correction.bypass_mode=true", "algorithm.policy_loss=reinforce"],
            {},
            "generate reward token_rewards old_log_prob advantages update_actor",
        ),
        (  # two data-parallel actor ranks: the batch is token-balanced over them first
            [*GRPO, "trainer.n_devices_per_node=2"],
            {},
            "generate reward token_rewards balance_batch old_log_prob advantages update_actor",
        ),
        ([*GRPO, "trainer.n_devices_per_node=2", "trainer.balance_batch=false"], {}, None),
        (
            ["algorithm.name=ppo", "algorithm.adv_estimator=remax", "rollout.val.n=1"],
            {},
            "remax_baseline generate reward token_rewards old_log_prob advantages update_actor",
        ),
    ],
)
def test_the_graph_holds_the_stages_the_config_asks_for(overrides, roles, stages):
    cfg = load_config(None, overrides, check_paths=False)
    flow, _ = build_rl_dataflow(cfg, _roles(**roles), RewardComputer.from_config(cfg, None))
    assert " ".join(flow.names) == (
        stages or "generate reward token_rewards old_log_prob advantages update_actor"
    )


def test_balance_batch_gives_each_data_parallel_rank_the_same_tokens_and_keeps_rows_whole():
    lengths = [9, 8, 7, 6, 2, 2, 1, 1]  # contiguous halves: 30 vs 6 tokens
    mask = torch.tensor([[1] * n + [0] * (9 - n) for n in lengths])
    batch = Batch({"attention_mask": mask, "row": torch.arange(8)}, {"uid": [f"g{i // 2}" for i in range(8)]})
    ctx = StepContext(step=1)
    out = balance_stage(2).run(ctx, batch)
    halves = [out["attention_mask"][:4].sum().item(), out["attention_mask"][4:].sum().item()]
    assert halves == [18, 18]
    assert sorted(out["row"].tolist()) == list(range(8))
    for i, row in enumerate(out["row"].tolist()):  # each row moves with all its columns
        assert out["uid"][i] == f"g{row // 2}"
        assert out["attention_mask"][i].sum().item() == lengths[row]
    assert ctx.metrics["balance/dp_token_imbalance_before"] == pytest.approx(60 / 36)
    assert ctx.metrics["balance/dp_token_imbalance"] == 1.0


def _corrected(old: list[float], rollout: list[float], **rc) -> tuple[Batch, StepContext]:
    cfg = load_config(
        None, [f"algorithm.rollout_correction.{k}={v}" for k, v in rc.items()], check_paths=False
    )
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    batch = Batch(
        {
            "old_log_probs": torch.tensor([old]),
            "rollout_log_probs": torch.tensor([rollout]),
            "response_mask": mask,
        }
    )
    ctx = StepContext(step=1)
    return rollout_correction_stage(cfg).run(ctx, batch), ctx


def test_rollout_correction_weights_are_truncated_token_ratios():
    old, rollout = [-1.0, -0.5, -3.0, -9.0], [-1.2, -2.0, -2.5, -1.0]
    out, ctx = _corrected(old, rollout, rollout_is="token", rollout_is_threshold=2.0)
    expected = [min(math.exp(o - r), 2.0) for o, r in zip(old[:3], rollout[:3])] + [0.0]
    assert out["rollout_is_weights"][0].tolist() == pytest.approx(expected, rel=1e-6)
    assert out["response_mask"].tolist() == [[1.0, 1.0, 1.0, 0.0]]  # no rejection asked for
    assert ctx.metrics["rollout_corr/rollout_is_max"] == pytest.approx(math.exp(1.5), rel=1e-6)


def test_rollout_rejection_drops_tokens_outside_the_bounds_from_the_mask():
    old, rollout = [-1.0, -0.5, -3.0, -9.0], [-1.2, -2.0, -2.5, -1.0]  # ratios e^0.2, e^1.5, e^-0.5
    out, ctx = _corrected(old, rollout, rollout_rs="token", rollout_rs_threshold=2.0)
    assert "rollout_is_weights" not in out.keys()
    assert out["response_mask"].tolist() == [[1.0, 0.0, 1.0, 0.0]]  # e^1.5 > 2 dropped; e^-0.5 > 1/2 kept
    assert ctx.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)


def test_pf_ppo_resamples_rows_by_score_reproducibly_per_step():
    cfg = load_config(
        None, ["algorithm.pf_ppo.enable=true", "algorithm.pf_ppo.reweight_method=max_min"], check_paths=False
    )
    stage = pf_ppo_stage(cfg)
    batch = Batch({"scores": torch.tensor([0.2, 1.0, 0.5, 0.0, 0.7]), "advantages": torch.arange(5.0)})
    first = stage.run(StepContext(step=3), batch)
    again = stage.run(StepContext(step=3), batch)
    assert len(first) == 5 and torch.equal(first["advantages"], again["advantages"])
    assert set(first["advantages"].tolist()) <= {1.0, 3.0}  # max_min keeps the best and the worst only


def test_optimal_token_baseline_gets_the_actors_columns_from_the_batch():
    cfg = _cfg(adv_estimator="optimal_token_baseline")
    stage, _ = advantages_stage(cfg)
    assert {"old_log_probs", "sum_pi_squared"} <= set(stage.reads)
    batch = _rollouts([1.0, 0.0, 0.5, 0.5], [7, 7, 9, 9])
    extra = {"old_log_probs": torch.full((4, 3), -0.7), "sum_pi_squared": torch.full((4, 3), 0.4)}
    out = stage.run(StepContext(step=1), Batch({**dict(batch.tensors.items()), **extra}))
    from megarl.algorithms.group_advantages import optimal_token_baseline

    expected, _ = optimal_token_baseline(
        batch["token_level_scores"], extra["old_log_probs"], extra["sum_pi_squared"], batch["uid"],
        batch["response_mask"],
    )  # fmt: skip
    assert torch.equal(out["advantages"], expected)
    assert out["advantages"].abs().sum() > 0


def test_a_fused_config_edited_into_several_updates_per_step_is_refused_before_any_worker_starts():
    from megarl.trainer.rl_trainer import RLTrainer

    cfg = load_config(None, [*GRPO, "data.train_batch_size=16"], check_paths=False)
    assert cfg.algorithm.old_log_prob == "fused"  # auto, decided at load
    cfg.algorithm.ppo_epochs = 2  # edited in Python afterwards
    with pytest.raises(ValueError, match=r"old_log_prob=fused, but algorithm.ppo_epochs=2 \(needs 1\)"):
        RLTrainer(cfg)
