"""The driver-side RL stages on real Batches: advantages (with in-reward KL) and DAPO's group filter."""

from __future__ import annotations

import pytest
import torch

from megarl.algorithms.advantages import scores_to_token_rewards
from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch
from megarl.trainer.dataflow import Stage, StepContext
from megarl.trainer.rl_stages import DynamicSamplingError, advantages_stage, filter_groups_stage


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
        _cfg(use_kl_in_reward=True, kl_estimator="k1", kl_coef=0.1, kl_ctrl="adaptive", kl_target=0.01)
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
