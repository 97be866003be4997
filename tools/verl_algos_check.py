"""Seeded comparison of megarl's algorithms with verl's own code (run by hand, not in CI).

Calls verl's `core_algos` (advantage estimators, policy losses, agg_loss, kl_penalty) and
`rollout_corr_helper` (IS weights, rejection) unchanged beside megarl's functions on seeded random
batches, and prints agree / disagree counts per function with the first disagreement of each, for
docs/verl-algorithms.md. verl must be importable but is never a megarl dependency:

    PYTHONPATH=/path/to/verl-site:$PWD python tools/verl_algos_check.py [--seeds 60]

Batches: 8 responses of up to 6 tokens in groups of 4 (some groups all-equal, some responses empty,
one group of one), fp32 as verl computes. "Agree" = the same values to 1e-4 (relative and absolute) on
the real tokens, or both raise.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from megarl.algorithms.advantages import ESTIMATORS
from megarl.algorithms.aggregate import LOSS_AGG_MODES, aggregate
from megarl.algorithms.kl import kl_penalty
from megarl.algorithms.policy_loss import POLICY_LOSSES
from megarl.algorithms.rollout_correction import compute_rollout_correction

B, L = 8, 6
TOL = 1e-4


def batch(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    if seed % 3 == 0:
        lengths[int(torch.randint(B, (1,), generator=g))] = 0  # a response emptied by rejection
    mask = (torch.arange(L)[None, :] < lengths[:, None]).float()
    groups = [0, 0, 0, 0, 1, 1, 1, 2] if seed % 2 else [0, 0, 0, 0, 1, 1, 1, 1]
    scores = torch.randint(0, 2, (B,), generator=g).float() if seed % 4 < 2 else torch.randn(B, generator=g)
    if seed % 5 == 0:
        scores[4:8] = scores[4]  # an all-equal group
    last = (lengths - 1).clamp_min(0)
    token_rewards = torch.zeros(B, L)
    token_rewards[torch.arange(B), last] = scores * (lengths > 0)
    old = -torch.rand(B, L, generator=g) * 3
    return dict(
        mask=mask,
        lengths=lengths,
        groups=torch.tensor(groups),
        index=np.array([f"p{i}" for i in groups], dtype=object),
        scores=token_rewards.sum(-1),
        token_rewards=token_rewards,
        values=torch.randn(B, L, generator=g) * mask,
        old=old,
        log_prob=old + 0.3 * torch.randn(B, L, generator=g),
        rollout=old + 0.2 * torch.randn(B, L, generator=g),
        ref=old + 0.4 * torch.randn(B, L, generator=g),
        advantages=torch.randn(B, L, generator=g) * mask,
        # Σ_v π_v² of a real distribution: π_t² plus at most (1 − π_t)² from the other tokens
        sum_pi_squared=old.exp() ** 2 + (1 - old.exp()) ** 2 * torch.rand(B, L, generator=g),
        baselines=torch.rand(B, generator=g),
    )


def same(a: Any, b: Any, mask: torch.Tensor | None = None) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if mask is not None and a.shape == mask.shape:
        a, b = a * mask, b * mask
    return a.shape == b.shape and bool(torch.allclose(a, b, rtol=TOL, atol=TOL, equal_nan=True))


def attempt(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a raise is a result to compare
        return e


class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.first: dict[str, str] = {}

    def check(self, name: str, ours: Callable[[], Any], theirs: Callable[[], Any], mask=None) -> None:
        a, b = attempt(ours), attempt(theirs)
        if isinstance(a, Exception) or isinstance(b, Exception):
            agree = isinstance(a, Exception) and isinstance(b, Exception)
        elif isinstance(a, tuple | list):
            agree = all(same(x, y, mask) for x, y in zip(a, b))
        else:
            agree = same(a, b, mask)
        self.counts[name][0 if agree else 1] += 1
        if not agree and name not in self.first:
            self.first[name] = f"megarl {short(a)} | verl {short(b)}"

    def report(self) -> None:
        total = [sum(c[i] for c in self.counts.values()) for i in (0, 1)]
        print(f"{'check':44s} agree disagree  first disagreement")
        for name in sorted(self.counts):
            agree, disagree = self.counts[name]
            print(f"{name:44s} {agree:5d} {disagree:8d}  {self.first.get(name, '')[:160]}")
        print(f"{'total':44s} {total[0]:5d} {total[1]:8d}")


def short(x: Any) -> str:
    if isinstance(x, Exception):
        return f"raises {type(x).__name__}: {str(x)[:60]}"
    if isinstance(x, tuple | list):
        x = x[0]
    t = torch.as_tensor(x, dtype=torch.float64)
    return str([round(v, 4) for v in t.flatten()[:8].tolist()])


def check_estimators(t: Tally, d: dict, ca: Any) -> None:
    m, idx = d["mask"], d["index"]
    cfg = SimpleNamespace(gamma=1.0, lam=0.95, norm_adv_by_std_in_grpo=True, get=lambda k, v=None: v)
    reg = ca.ADV_ESTIMATOR_REGISTRY
    group = dict(scores=d["scores"], group_ids=d["groups"], mask=m)

    def verl(name: str, **kw: Any) -> Callable[[], Any]:
        return lambda: reg[name](token_level_rewards=d["token_rewards"], response_mask=m, **kw)[0]

    t.check(
        "adv/gae",
        lambda: ESTIMATORS["gae"](d["token_rewards"], d["values"], m, 1.0, 0.95)[0],
        lambda: reg["gae"](d["token_rewards"], d["values"], m, 1.0, 0.95)[0],
        m,
    )
    for norm in (True, False):
        for verl_name in ("grpo", "grpo_vectorized"):
            t.check(
                f"adv/{verl_name}(norm_by_std={norm})",
                lambda norm=norm: ESTIMATORS["grpo"](**group, norm_by_std=norm)[0],
                verl(verl_name, index=idx, norm_adv_by_std_in_grpo=norm),
                m,
            )
    for verl_name in ("rloo", "rloo_vectorized"):
        t.check(
            f"adv/{verl_name}",
            lambda: ESTIMATORS["rloo"](**group)[0],
            verl(verl_name, index=idx, config=cfg),
            m,
        )
    t.check(
        "adv/reinforce_plus_plus",
        lambda: ESTIMATORS["reinforce_plus_plus"](d["token_rewards"], m, 1.0)[0],
        verl("reinforce_plus_plus", config=cfg),
        m,
    )
    for name in ("reinforce_plus_plus_baseline", "opo", "grpo_passk"):
        t.check(
            f"adv/{name}",
            lambda name=name: ESTIMATORS[name](**group)[0],
            verl(name, index=idx, config=cfg),
            m,
        )
    t.check("adv/gpg", lambda: ESTIMATORS["gpg"](**group)[0], verl("gpg", index=idx, config=cfg), m)
    t.check(
        "adv/remax",
        lambda: ESTIMATORS["remax"](d["token_rewards"], d["baselines"], m)[0],
        verl("remax", reward_baselines=d["baselines"], config=cfg),
        m,
    )
    for zero_tail in (True, False):  # verl's default True; megarl's is verl's False
        t.check(
            f"adv/optimal_token_baseline(handle_zero_tail={zero_tail})",
            lambda: ESTIMATORS["optimal_token_baseline"](
                d["token_rewards"], d["old"], d["sum_pi_squared"], d["groups"], m
            )[0],
            verl(
                "optimal_token_baseline",
                index=idx,
                old_log_probs=d["old"],
                sum_pi_squared=d["sum_pi_squared"],
                handle_zero_tail=zero_tail,
            ),
            m,
        )


def check_losses(t: Tally, d: dict, ca: Any, actor_config: Any) -> None:
    m = d["mask"]
    v = d["advantages"] + 1.0
    for mode in LOSS_AGG_MODES:
        t.check(
            f"agg/{mode}", lambda mode=mode: aggregate(v, m, mode), lambda mode=mode: ca.agg_loss(v, m, mode)
        )
    for name in ("vanilla", "gspo", "cispo", "sapo", "gpg", "geo_mean", "clip_cov", "kl_cov"):
        for mode in LOSS_AGG_MODES:
            cfg = actor_config(name)

            def ours(name=name, mode=mode, cfg=cfg):
                params = {}
                if name == "sapo":
                    params = dict(tau_pos=cfg.tau_pos, tau_neg=cfg.tau_neg)
                if name == "clip_cov":
                    pl = cfg.policy_loss
                    params = dict(
                        clip_cov_ratio=pl.clip_cov_ratio,
                        clip_cov_lb=pl.clip_cov_lb,
                        clip_cov_ub=pl.clip_cov_ub,
                    )
                if name == "kl_cov":
                    params = dict(
                        kl_cov_ratio=cfg.policy_loss.kl_cov_ratio, ppo_kl_coef=cfg.policy_loss.ppo_kl_coef
                    )
                return POLICY_LOSSES[name](
                    d["log_prob"],
                    d["old"],
                    d["advantages"],
                    m,
                    cfg.clip_ratio_low,
                    cfg.clip_ratio_high,
                    clip_ratio_c=cfg.clip_ratio_c if name == "vanilla" else None,
                    agg_mode=mode,
                    **params,
                )[0]

            def theirs(name=name, mode=mode, cfg=cfg):
                fn = ca.POLICY_LOSS_REGISTRY[name]
                return fn(d["old"], d["log_prob"], d["advantages"], m, loss_agg_mode=mode, config=cfg)[0]

            t.check(f"loss/{name}/{mode}", ours, theirs)


def check_kl(t: Tally, d: dict, ca: Any) -> None:
    names = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
    for name in names + ("k1+", "k3+", "low_var_kl+", "abs+", "mse+", "k2+"):
        t.check(
            f"kl/{name}",
            lambda name=name: kl_penalty(d["log_prob"], d["ref"], name),
            lambda name=name: ca.kl_penalty(d["log_prob"], d["ref"], name),
            d["mask"],
        )
        if name.endswith("+"):

            def grad(fn, name=name):
                x = d["log_prob"].clone().requires_grad_(True)
                return torch.autograd.grad((fn(x, d["ref"], name) * d["mask"]).sum(), x)[0]

            t.check(
                f"kl/{name} gradient",
                lambda grad=grad: grad(kl_penalty),
                lambda grad=grad: grad(ca.kl_penalty),
            )


def check_rollout_correction(t: Tally, d: dict, rc: Any) -> None:
    m, old, rollout = d["mask"], d["old"], d["rollout"]
    if d["lengths"].sum() == 0:
        return
    log_ratio = old - rollout
    for level in ("token", "sequence"):
        for normalize in (False, True):
            ours = compute_rollout_correction(
                old, rollout, m, is_level=level, is_threshold=1.2, is_batch_normalize=normalize
            )
            theirs = attempt(
                lambda level=level, normalize=normalize: rc.compute_rollout_correction_weights(
                    log_ratio,
                    m,
                    rollout_is=level,
                    rollout_is_threshold=1.2,
                    rollout_is_batch_normalize=normalize,
                )
            )
            name = f"is/{level}{'/normalized' if normalize else ''}"
            t.check(f"{name}/weights", lambda ours=ours: ours[0], lambda theirs=theirs: theirs[0], m)
            for metric in ("rollout_is_mean", "rollout_is_max", "rollout_is_ratio_fraction_high"):
                t.check(
                    f"{name}/{metric}",
                    lambda ours=ours, metric=metric: ours[2][f"rollout_corr/{metric}"],
                    lambda theirs=theirs, metric=metric: theirs[1][metric],
                )
    for level, threshold in (
        ("token_k1", "0.8_1.3"),
        ("seq_sum_k1", "0.5_2.0"),
        ("seq_mean_k1", "0.9_1.1"),
        ("token_k2", 0.02),
        ("token_k3", 0.02),
        ("seq_sum_k2", 0.05),
        ("seq_sum_k3", 0.05),
        ("seq_mean_k2", 0.01),
        ("seq_mean_k3", 0.01),
        ("seq_max_k2", 0.03),
        ("seq_max_k3", 0.03),
    ):
        lower, upper = map(float, threshold.split("_")) if isinstance(threshold, str) else (None, threshold)
        t.check(
            f"rs/{level}",
            lambda level=level, lower=lower, upper=upper: compute_rollout_correction(
                old, rollout, m, rs_level=level, rs_threshold=upper, rs_threshold_lower=lower
            )[1],
            lambda level=level, threshold=threshold: rc.compute_rollout_rejection_mask(
                log_ratio, m, rollout_rs=level, rollout_rs_threshold=threshold
            )[0],
        )
    old_names = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
    for level, verl_level in old_names.items():
        t.check(
            f"rs/{level} (symmetric 1/2..2 = {verl_level})",
            lambda level=level: compute_rollout_correction(old, rollout, m, rs_level=level, rs_threshold=2.0)[
                1
            ],
            lambda verl_level=verl_level: rc.compute_rollout_rejection_mask(
                log_ratio, m, rollout_rs=verl_level, rollout_rs_threshold="0.5_2.0"
            )[0],
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=60)
    args = parser.parse_args()
    import verl
    from verl.trainer.ppo import core_algos as ca
    from verl.trainer.ppo import rollout_corr_helper as rc
    from verl.workers.config import ActorConfig, PolicyLossConfig

    def actor_config(loss_mode: str) -> Any:
        clip = (0.4, 0.4) if loss_mode == "geo_mean" else (0.2, 0.28)
        return ActorConfig(
            strategy="fsdp",
            rollout_n=1,
            ppo_micro_batch_size_per_gpu=1,
            clip_ratio_low=clip[0],
            clip_ratio_high=clip[1],
            policy_loss=PolicyLossConfig(loss_mode=loss_mode),
        )

    print(f"verl {verl.__version__} from {verl.__file__}; {args.seeds} seeds; tolerance {TOL}")
    t = Tally()
    for seed in range(args.seeds):
        torch.manual_seed(seed)  # clip_cov / kl_cov pick tokens at random in both
        d = batch(seed)
        check_estimators(t, d, ca)
        check_losses(t, d, ca, actor_config)
        check_kl(t, d, ca)
        check_rollout_correction(t, d, rc)
    t.report()
    if not math.isfinite(sum(c[0] for c in t.counts.values())):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
