"""The per-item preference terms: their batch means are the batch loss and metrics, however the batch
is split (the property the actor's micro-batches and DP ranks rely on)."""

from __future__ import annotations

import math

import pytest
import torch

from megarl.algorithms.preference_terms import BatchCounts, PreferenceSettings, kto_terms, pair_terms


def _pairs(p: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    chosen, rejected = -torch.rand(p, generator=g, dtype=torch.float64) * 5, -torch.rand(p, generator=g) * 5
    ref_c, ref_r = -torch.rand(p, generator=g) * 5, -torch.rand(p, generator=g) * 5
    return chosen, rejected.double(), ref_c.double(), ref_r.double()


def test_dpo_terms_are_the_papers_loss_and_implicit_rewards():
    c, r, rc, rr = _pairs()
    s = PreferenceSettings("dpo", beta=0.3)
    losses, metrics = pair_terms(s, c, r, rc, rr, BatchCounts(6))
    for i in range(6):
        h = (c[i] - rc[i]) - (r[i] - rr[i])
        assert losses[i].item() == pytest.approx(math.log1p(math.exp(-0.3 * h.item())), rel=1e-12)
        assert metrics["rewards/margin"][i].item() == pytest.approx(0.3 * h.item(), rel=1e-12)
        assert metrics["rewards/accuracy"][i].item() == float(h.item() > 0)


def test_orpo_nll_share_averages_to_the_token_mean_over_every_chosen_token():
    c, r, _, _ = _pairs()
    nll_sums = torch.tensor([3.0, 5.0, 1.0, 2.0, 4.0, 6.0], dtype=torch.float64)
    tokens = 21  # chosen response tokens of the 6 pairs
    s = PreferenceSettings("orpo", beta=0.1)
    losses, metrics = pair_terms(s, c, r, None, None, BatchCounts(6, chosen_tokens=tokens), nll_sums)
    assert metrics["orpo/nll_loss"].mean().item() == pytest.approx(nll_sums.sum().item() / tokens)
    assert losses.mean().item() == pytest.approx(
        nll_sums.sum().item() / tokens + metrics["orpo/odds_ratio_loss"].mean().item()
    )


def test_pair_terms_of_halves_average_to_the_whole_batch():
    c, r, rc, rr = _pairs()
    s = PreferenceSettings("dpo", beta=0.1, label_smoothing=0.2)
    whole, metrics = pair_terms(s, c, r, rc, rr, BatchCounts(6))
    halves = [pair_terms(s, c[k], r[k], rc[k], rr[k], BatchCounts(6))[0] for k in (slice(0, 2), slice(2, 6))]
    assert (halves[0].sum() + halves[1].sum()).item() / 6 == pytest.approx(whole.mean().item(), rel=1e-12)


def test_kto_metric_shares_sum_to_the_desirable_and_undesirable_means():
    g = torch.Generator().manual_seed(1)
    logps = -torch.rand(8, generator=g, dtype=torch.float64) * 4
    ref = -torch.rand(8, generator=g, dtype=torch.float64) * 4
    desirable = torch.tensor([True, False, True, True, False, True, False, True])
    counts = BatchCounts(8, desirable=5, undesirable=3, ref_point=0.02)
    s = PreferenceSettings("kto", beta=0.5, desirable_weight=1.0, undesirable_weight=2.0)
    losses, metrics = kto_terms(s, logps, ref, desirable, counts)
    rewards = 0.5 * (logps - ref)
    assert metrics["rewards/chosen"].mean().item() == pytest.approx(rewards[desirable].mean().item())
    assert metrics["rewards/rejected"].mean().item() == pytest.approx(rewards[~desirable].mean().item())
    assert metrics["rewards/margin"].mean().item() == pytest.approx(
        rewards[desirable].mean().item() - rewards[~desirable].mean().item()
    )
    z = 0.5 * (logps - ref - 0.02)
    expected = torch.where(desirable, 1 - torch.sigmoid(z), 2.0 * (1 - torch.sigmoid(-z)))
    assert torch.allclose(losses, expected, rtol=1e-12)


def test_settings_take_the_losss_default_beta_and_pair_terms_need_a_paired_name():
    from megarl.config.schema import MegarlConfig

    cfg = MegarlConfig()
    for name, beta in (("dpo", 0.1), ("simpo", 2.0)):
        cfg.algorithm.name = name
        assert PreferenceSettings.from_config(cfg).beta == beta
    cfg.preference.beta = 0.3
    assert PreferenceSettings.from_config(cfg).beta == 0.3
    with pytest.raises(ValueError, match="not a paired"):
        pair_terms(PreferenceSettings("kto", 0.1), *_pairs(), BatchCounts(6))


def test_kto_batch_without_undesirable_examples_reports_no_rejected_side():
    logps = torch.tensor([-1.0, -2.0], dtype=torch.float64)
    counts = BatchCounts(2, desirable=2, undesirable=0)
    _, metrics = kto_terms(
        PreferenceSettings("kto", 0.1), logps, logps - 0.5, torch.tensor([True, True]), counts
    )
    assert sorted(metrics) == ["logps/chosen", "rewards/chosen"]


def test_a_tied_pair_does_not_count_as_accurate():
    same = torch.tensor([-2.0], dtype=torch.float64)
    _, metrics = pair_terms(PreferenceSettings("dpo", 0.1), same, same, same, same, BatchCounts(1))
    assert metrics["rewards/accuracy"].item() == 0.0
