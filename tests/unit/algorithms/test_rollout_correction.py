"""Rollout correction (truncated IS, rejection, veto, mismatch metrics) against per-token / per-sequence
loops written from verl's definitions."""

from __future__ import annotations

import math

import pytest
import torch

from megarl.algorithms.rollout_correction import compute_rollout_correction
from tests.unit.algorithms.conftest import LENGTHS, RESPONSE_LEN, mask_of, randn

pytestmark = pytest.mark.unit

SHAPE = (len(LENGTHS), RESPONSE_LEN)
C = 2.0  # IS truncation
# token log-ratios old − rollout: close to 1, beyond C and 1/C, past the ±20 exp guard
LOG_RATIOS = [-25.0, -1.0, -0.5, -0.05, 0.0, 0.05, 0.5, 1.0, 25.0]
# (rs_threshold, rs_threshold_lower) per rejection level, each dropping some and keeping some
RS_BOUNDS = {"token": (2.0, None), "sequence": (3.0, 0.2), "geometric": (1.3, None)}
VETO = 1e-4
TOL = dict(rel=1e-12, abs=1e-12)


# per-sequence log-ratio offsets: sums and means either side of the sequence-level bounds
SEQ_OFFSETS = [0.15, 0.1, 0.3, 0.0, -0.05, -0.4, 0.5]


@pytest.fixture(params=["spread", "per_sequence"])
def log_probs(request, gen, mask):
    """(old_log_prob, rollout_log_prob): "spread" puts every log-ratio of LOG_RATIOS on some real token,
    "per_sequence" gives each sequence its offset of SEQ_OFFSETS plus a little noise."""
    old = randn(gen, *SHAPE) - 2
    if request.param == "per_sequence":
        offsets = torch.tensor(SEQ_OFFSETS, dtype=torch.float64)[:, None]
        return old, old - offsets - 0.02 * randn(gen, *SHAPE)
    pick = torch.randint(len(LOG_RATIOS), SHAPE, generator=gen)
    real = mask > 0
    every = torch.arange(int(real.sum())) % len(LOG_RATIOS)
    pick[real] = every[torch.randperm(every.numel(), generator=gen)]
    return old, old - torch.tensor(LOG_RATIOS, dtype=torch.float64)[pick]


def bound(x: float) -> float:
    return min(max(x, -20.0), 20.0)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def reference(old, rollout, is_level, rs_level, veto, normalize):
    """(weights, new mask, metrics without the prefix), one token / sequence at a time."""
    rho = [[old[i, t].item() - rollout[i, t].item() for t in range(n)] for i, n in enumerate(LENGTHS)]
    rows = [i for i, n in enumerate(LENGTHS) if n]  # the sequences with tokens
    tokens = [(i, t) for i in rows for t in range(LENGTHS[i])]
    weights = torch.zeros(SHAPE, dtype=torch.float64)
    keep = mask_of(LENGTHS)
    metrics = {}
    if is_level is not None:
        level = {i: sum(rho[i]) for i in rows}  # sequence: Σ_t ρ_t
        raw = {(i, t): math.exp(bound(rho[i][t] if is_level == "token" else level[i])) for i, t in tokens}
        for i, t in tokens:
            weights[i, t] = min(raw[i, t], C)
        units = [rho[i][t] for i, t in tokens] if is_level == "token" else [level[i] for i in rows]
        metrics["rollout_is_mean"] = mean([weights[i, t].item() for i, t in tokens])
        metrics["rollout_is_raw_mean"] = mean([raw[i, t] for i, t in tokens])
        metrics["rollout_is_max"] = max(raw.values())
        metrics["rollout_is_ratio_fraction_high"] = mean([u > math.log(C) for u in units])
        metrics["rollout_is_ratio_fraction_low"] = mean([u < -math.log(C) for u in units])
        if normalize:
            per_unit = [weights[i, t].item() for i, t in tokens] if is_level == "token" else None
            per_unit = per_unit or [weights[i, 0].item() for i in rows]
            metrics["rollout_is_batch_norm_factor"] = mean(per_unit)
            weights /= mean(per_unit)
    if rs_level is not None:
        upper, lower = RS_BOUNDS[rs_level]
        lower = 1 / upper if lower is None else lower
        rejected = set()
        for i, t in tokens:
            value = {"token": rho[i][t], "sequence": sum(rho[i]), "geometric": mean(rho[i])}[rs_level]
            if not math.log(lower) <= value <= math.log(upper):
                rejected.add((i, t))
                keep[i, t] = 0.0
        metrics["rollout_rs_masked_fraction"] = len(rejected) / len(tokens)
        metrics["rollout_rs_seq_masked_fraction"] = mean(
            [any((i, t) in rejected for t in range(LENGTHS[i])) for i in rows]
        )
    if veto is not None:
        catastrophic = [(i, t) for i, t in tokens if rho[i][t] < math.log(veto)]
        vetoed = {i for i, _ in catastrophic}
        for i in vetoed:
            keep[i] = 0.0
        metrics["rollout_is_veto_fraction"] = len(vetoed) / len(rows)
        metrics["rollout_is_catastrophic_token_fraction"] = len(catastrophic) / len(tokens)
    mean_old = {i: mean([old[i, t].item() for t in range(LENGTHS[i])]) for i in rows}
    mean_rollout = {i: mean([rollout[i, t].item() for t in range(LENGTHS[i])]) for i in rows}
    metrics.update(
        kl=mean([-rho[i][t] for i, t in tokens]),
        k3_kl=mean([math.exp(bound(rho[i][t])) - bound(rho[i][t]) - 1 for i, t in tokens]),
        training_ppl=mean([math.exp(-mean_old[i]) for i in rows]),
        rollout_ppl=mean([math.exp(-mean_rollout[i]) for i in rows]),
        log_ppl_diff=mean([mean_rollout[i] - mean_old[i] for i in rows]),
        ppl_ratio=mean([math.exp(mean_rollout[i] - mean_old[i]) for i in rows]),
        chi2_token=mean([math.exp(2 * bound(rho[i][t])) for i, t in tokens]) - 1,
        chi2_seq=mean([math.exp(2 * bound(sum(rho[i]))) for i in rows]) - 1,
    )
    return weights, keep, metrics


@pytest.mark.parametrize("veto", [None, VETO])
@pytest.mark.parametrize("rs_level", [None, "token", "sequence", "geometric"])
@pytest.mark.parametrize("is_level", [None, "token", "sequence"])
def test_weights_mask_and_metrics_match_the_loops(request, log_probs, mask, is_level, rs_level, veto):
    old, rollout = log_probs
    upper, lower = RS_BOUNDS.get(rs_level, (None, None))
    weights, new_mask, metrics = compute_rollout_correction(
        old, rollout, mask, is_level=is_level, is_threshold=C, rs_level=rs_level, rs_threshold=upper,
        rs_threshold_lower=lower, veto_threshold=veto,
    )  # fmt: skip
    ref_weights, ref_mask, ref_metrics = reference(old, rollout, is_level, rs_level, veto, normalize=False)
    if is_level is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)
        assert not weights.requires_grad
    torch.testing.assert_close(new_mask, ref_mask, rtol=0, atol=0)
    assert set(metrics) == {f"rollout_corr/{name}" for name in ref_metrics}
    for name, value in ref_metrics.items():
        assert metrics[f"rollout_corr/{name}"].item() == pytest.approx(value, **TOL), name
    # every branch is taken: truncated and untruncated weights, dropped and kept tokens / sequences
    spread = "spread" in request.node.callspec.id
    if is_level is not None and (spread or is_level == "sequence"):
        assert (
            0 < ref_metrics["rollout_is_ratio_fraction_high"] < 1
            and ref_metrics["rollout_is_ratio_fraction_low"] > 0
        )
    if rs_level is not None and (spread or rs_level != "token"):
        dropped = "rollout_rs_masked_fraction" if rs_level == "token" else "rollout_rs_seq_masked_fraction"
        assert 0 < ref_metrics[dropped] < 1
    if veto is not None and spread:
        assert 0 < ref_metrics["rollout_is_veto_fraction"] < 1


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_rejection_lower_bound_defaults_to_one_over_the_upper(level):
    mask = mask_of([1, 1])
    old = torch.zeros(2, RESPONSE_LEN, dtype=torch.float64)
    rollout = old - torch.tensor([[math.log(0.5) - 1e-6], [math.log(0.5) + 1e-6]], dtype=torch.float64)
    _, new_mask, _ = compute_rollout_correction(old, rollout, mask, rs_level=level, rs_threshold=2.0)
    assert new_mask[:, 0].tolist() == [0.0, 1.0]


@pytest.mark.parametrize("is_level", ["token", "sequence"])
def test_batch_normalised_weights_average_one(log_probs, mask, is_level):
    old, rollout = log_probs
    weights, _, metrics = compute_rollout_correction(
        old, rollout, mask, is_level=is_level, is_threshold=C, is_batch_normalize=True
    )
    ref_weights, _, ref_metrics = reference(old, rollout, is_level, None, None, normalize=True)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-12, atol=1e-12)
    factor = metrics["rollout_corr/rollout_is_batch_norm_factor"].item()
    assert factor == pytest.approx(ref_metrics["rollout_is_batch_norm_factor"], **TOL)
    assert metrics["rollout_corr/rollout_is_mean"].item() == pytest.approx(
        ref_metrics["rollout_is_mean"], **TOL
    )


def test_weights_are_detached_and_zero_on_padding(log_probs, mask):
    old, rollout = (t.clone().requires_grad_(True) for t in log_probs)
    weights, new_mask, metrics = compute_rollout_correction(old, rollout, mask, is_level="token")
    assert not weights.requires_grad and not any(v.requires_grad for v in metrics.values())
    assert (weights[mask == 0] == 0).all() and (weights[mask > 0] > 0).all()
    assert torch.equal(new_mask, mask)


def test_fp32_matches_fp64(log_probs, mask):
    results = [
        compute_rollout_correction(
            *(t.to(dtype) for t in (*log_probs, mask)),
            is_level="sequence",
            rs_level="geometric",
            rs_threshold=1.3,
            veto_threshold=VETO,
        )  # fmt: skip
        for dtype in (torch.float64, torch.float32)
    ]
    (w64, mask64, metrics64), (w32, mask32, metrics32) = results
    torch.testing.assert_close(w32.double(), w64, rtol=1e-5, atol=0)
    assert torch.equal(mask32.double(), mask64)
    for name, value in metrics64.items():
        assert metrics32[name].item() == pytest.approx(value.item(), rel=1e-5, abs=1e-6), name


def test_empty_mask_gives_zero_metrics(log_probs):
    empty = torch.zeros(SHAPE, dtype=torch.float64)
    weights, new_mask, metrics = compute_rollout_correction(
        *log_probs, empty, is_level="sequence", rs_level="token", rs_threshold=2.0, veto_threshold=VETO
    )
    assert (weights == 0).all() and (new_mask == 0).all()
    assert all(torch.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"is_level": "seq"}, "unknown rollout IS level 'seq'; use one of token, sequence"),
        ({"is_level": "token", "is_threshold": 0.0}, "rollout IS threshold 0.0 must be > 0"),
        ({"rs_level": "tok", "rs_threshold": 2.0}, "use one of token, sequence, geometric"),
        ({"rs_level": "token"}, "needs rs_threshold"),
        ({"rs_level": "token", "rs_threshold": 2.0, "rs_threshold_lower": 3.0}, "0 < lower=3.0 <= upper=2.0"),
        ({"veto_threshold": 0.0}, "veto_threshold=0.0 must be > 0"),
    ],
)
def test_bad_settings_are_named(log_probs, mask, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_rollout_correction(*log_probs, mask, **kwargs)


def test_rollout_is_mean_is_the_truncated_mean_and_raw_mean_the_one_before_truncation():
    """Log-ratios [ln 3, 0], C = 2: weights [2, 1]. verl 0.9.1's rollout_is_mean is the truncated mean 1.5
    (computed with the reference install, pinned); verl 0.8 logged the mean before truncation, 2.0, under
    that name, which megarl logs as rollout_is_raw_mean."""
    mask = torch.ones(1, 2, dtype=torch.float64)
    rollout = -torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64)
    _, _, metrics = compute_rollout_correction(torch.zeros_like(mask), rollout, mask, is_level="token")
    assert metrics["rollout_corr/rollout_is_mean"].item() == pytest.approx(1.5, rel=1e-12)
    assert metrics["rollout_corr/rollout_is_raw_mean"].item() == pytest.approx(2.0, rel=1e-12)


# verl 0.9.1's rollout_corr_helper.compute_rollout_rejection_mask on VERL_RHO (log π_train − log π_rollout)
# and VERL_MASK: {rollout_rs: (rollout_rs_threshold, the mask it returns)}, computed once with the
# reference install and pinned here
VERL_RHO = [[0.5, -0.2, 0.05, 0.0], [-0.5, 0.1, 0.0, 0.0], [-1.2, 0.3, 0.2, 0.0], [0.3] * 4, [0.45, 0, 0, 0]]
VERL_MASK = [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]
VERL_REJECTION = {
    "token_k1": ("0.5_1.5", [[1, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]]),
    "seq_sum_k1": ("0.5_1.5", [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]),
    "seq_mean_k1": ("0.7_1.5", [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]),
    "token_k2": (0.1, [[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]),
    "token_k3": (0.1, [[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]),
    "seq_sum_k2": (0.15, [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]),
    "seq_sum_k3": (0.15, [[0, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]]),
    "seq_mean_k2": (0.05, [[1, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
    "seq_mean_k3": (0.05, [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
    "seq_max_k2": (0.1, [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
    "seq_max_k3": (0.1, [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]),
}


@pytest.mark.parametrize("level", sorted(VERL_REJECTION))
def test_verl_09_rejection_names_drop_what_verl_drops(level):
    threshold, expected = VERL_REJECTION[level]
    lower, upper = (
        (float(x) for x in threshold.split("_")) if isinstance(threshold, str) else (None, threshold)
    )
    mask = torch.tensor(VERL_MASK, dtype=torch.float64)
    rollout = -torch.tensor(VERL_RHO, dtype=torch.float64)
    _, new_mask, _ = compute_rollout_correction(
        torch.zeros_like(mask), rollout, mask, rs_level=level, rs_threshold=upper, rs_threshold_lower=lower
    )
    assert new_mask.int().tolist() == expected
