"""The places where megarl's numbers differ from verl 0.9.1's on purpose (docs/verl-algorithms.md), pinned.
verl's numbers in the comments were computed once with the reference install (tools/verl_algos_check.py
compares the rest)."""

from __future__ import annotations

import math

import pytest
import torch

from megarl.algorithms.advantages import grpo, rloo
from megarl.algorithms.cov_losses import kl_cov_loss
from megarl.algorithms.group_advantages import optimal_token_baseline

pytestmark = pytest.mark.unit


def test_otb_gives_an_all_equal_group_zero_even_where_tokens_are_confident():
    # verl: the baseline is Σ w·G / (Σ w + 1e-8) with w ≈ 0 for π ≈ 1, so its advantages are [1.0, 1.0, 1.0]
    mask = torch.ones(4, 3)
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = 1.0
    old = torch.full((4, 3), -1e-4)
    adv, _ = optimal_token_baseline(rewards, old, old.exp() ** 2, torch.zeros(4, dtype=torch.long), mask)
    assert adv.abs().max().item() == 0.0


def test_rloo_keeps_a_lone_samples_score():
    # verl rloo: [-1, 1, 5]; verl rloo_vectorized: [-1, 1, 0]
    adv, _ = rloo(torch.tensor([1.0, 2.0, 5.0]), torch.tensor([0, 0, 1]), torch.ones(3, 1))
    assert adv.flatten().tolist() == [-1.0, 1.0, 5.0]


def test_grpo_gives_an_all_equal_group_exactly_zero():
    # verl grpo and grpo_vectorized (fp32 group moments): [0, 0, 0] here; an fp32 mean can be an ulp off
    adv, _ = grpo(torch.full((3,), 0.1), torch.zeros(3, dtype=torch.long), torch.ones(3, 1))
    assert adv.flatten().tolist() == [0.0, 0.0, 0.0]


def test_cov_losses_clamp_the_ratio_at_e_to_the_20():
    # verl kl_cov (no clamp) on log-ratios [30, 0], advantages 1, token-mean: −(e^30 + 1)/2 ≈ −5.34e12
    log_prob = torch.tensor([[30.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.float64)
    loss, _ = kl_cov_loss(log_prob, torch.zeros_like(log_prob), mask, mask, 0.2, 0.2, kl_cov_ratio=1e-9)
    # megarl: the ratio at e^20, plus the KL term ppo_kl_coef · |30| on the one token it penalises
    assert loss.item() == pytest.approx((-(math.exp(20) + 1) + 0.1 * 30) / 2, rel=1e-12)
