"""Rank code for test_fsdp: the FSDP roles against the Megatron roles and transformers, at this launch's
world size (the test runs it at 2 ranks and at 1: FSDP's DP2 vs DP1).

argv: POLICY_HF REWARD_HF. Both actors are built through the "spmd" worker groups (the same dispatch as
Ray) on the same layout (TP1, DP = world), given the same batch; rank 0 reports log-probs, the step-1
loss and gradient norm of each, and the log-probs after the update (which depend on every parameter).
"""

from __future__ import annotations

import torch

from megarl.config.roles import role_spec
from megarl.controller.group import make_colocated_groups, make_worker_group
from megarl.protocol import Batch
from megarl.workers.actor import ActorWorker
from megarl.workers.critic import CriticWorker
from megarl.workers.fsdp_roles import FSDPActorWorker, FSDPCriticWorker, FSDPReferenceWorker
from megarl.workers.reference import ReferenceWorker
from tests.multiproc.policy_checks import RESPONSE, N, config, hf_reference, max_diff, rollout_batch


def run_actor(cfg, backend: str, batch: Batch) -> dict:
    cfg.actor.backend = backend
    actor_cls, ref_cls = (
        (FSDPActorWorker, FSDPReferenceWorker) if backend == "fsdp" else (ActorWorker, ReferenceWorker)
    )
    groups = make_colocated_groups(
        "spmd",
        None,
        {
            "actor": (actor_cls, {"spec": role_spec(cfg, "actor")}),
            "ref": (ref_cls, {"spec": role_spec(cfg, "ref")}),
        },
    )
    actor, ref = groups["actor"], groups["ref"]
    lp = actor.log_prob(batch)
    mask = batch["response_mask"]
    advantages = torch.randn(N, RESPONSE, generator=torch.Generator().manual_seed(1)) * mask
    train = batch.union(Batch(tensors={"old_log_probs": lp["old_log_probs"], "advantages": advantages}))
    metrics = actor.update(train)[0]
    return {
        "log_probs": lp["old_log_probs"],
        "entropy": lp["entropy"],
        "ref_log_probs": ref.ref_log_prob(batch)["ref_log_probs"],
        "pg_loss": metrics["actor/pg_loss"],
        "grad_norm": metrics["grad_norm"],
        "after": actor.log_prob(batch)["old_log_probs"],
    }


def run_critic(cfg, backend: str, batch: Batch) -> dict:
    cfg.critic.backend = backend
    cls = FSDPCriticWorker if backend == "fsdp" else CriticWorker
    critic = make_worker_group("spmd", None, cls, "critic", {"spec": role_spec(cfg, "critic")})
    values = critic.values(batch)["values"]
    mask = batch["response_mask"]
    returns = torch.randn(N, RESPONSE, generator=torch.Generator().manual_seed(2)) * mask
    losses = [
        critic.update(batch.union(Batch(tensors={"values": values, "returns": returns})))[0] for _ in range(3)
    ]
    return {
        "values": values,
        "vf_losses": [m["critic/vf_loss"] for m in losses],
        "grad_norm": losses[0]["grad_norm"],
    }


def main(argv: list[str]) -> dict:
    policy, reward = argv
    from transformers import AutoConfig

    batch = rollout_batch(AutoConfig.from_pretrained(policy).vocab_size)
    ref = hf_reference(policy, batch)
    rm_ref = hf_reference(reward, batch)
    out: dict = {}
    runs = {}
    for backend in ("megatron", "fsdp"):
        runs[backend] = run_actor(config(policy, reward, 1, 1), backend, batch)
    packed_cfg = config(policy, reward, 1, 1, max_tokens=40)
    runs["fsdp_packed"] = run_actor(packed_cfg, "fsdp", batch)
    for name, run in runs.items():
        out[name] = {
            "log_prob_vs_hf": max_diff(run["log_probs"], ref["log_probs"]),
            "entropy_vs_hf": max_diff(run["entropy"], ref["entropy"]),
            "ref_vs_hf": max_diff(run["ref_log_probs"], ref["log_probs"]),
            "pg_loss": run["pg_loss"],
            "grad_norm": run["grad_norm"],
            "after_vs_megatron": max_diff(run["after"], runs["megatron"]["after"]),
            "moved": max_diff(run["after"], run["log_probs"]),
            "after": run["after"].tolist(),
        }
    critics = {
        backend: run_critic(config(policy, reward, 1, 1), backend, batch) for backend in ("megatron", "fsdp")
    }
    for name, run in critics.items():
        out[f"critic_{name}"] = {
            "values_vs_hf": max_diff(run["values"], rm_ref["values"]),
            "vf_losses": run["vf_losses"],
            "grad_norm": run["grad_norm"],
        }
    return out
