"""Rank code for test_policy_workers: the Megatron policy, critic and reward workers on 4 ranks.

argv: POLICY_HF REWARD_HF PARTS, PARTS = "layouts", "batching" or both ("layouts,batching": one launch,
whose report holds both parts' keys). For every layout it builds the workers through the "spmd" worker
groups (the same dispatch as Ray; actor and reference colocated), and rank 0 reports per-layout numbers
against transformers fp32 references.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from megarl.algorithms.policy_loss import ppo_clip_loss, sapo_loss
from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.controller.group import WorkerGroup, make_colocated_groups, make_worker_group
from megarl.controller.worker import WorkerError
from megarl.data.batching import balance_for_dp
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.protocol import Batch
from megarl.workers.actor import ActorWorker
from megarl.workers.critic import CriticWorker
from megarl.workers.reference import ReferenceWorker
from megarl.workers.reward import RewardModelWorker
from megarl.workers.sequences import sequences_from_batch
from tests.multiproc.preference_checks import check_preference

LAYOUTS = {"tp1pp1": (1, 1), "tp2pp1": (2, 1), "tp1pp2": (1, 2), "tp2pp2": (2, 2)}
N, PROMPT, RESPONSE = 8, 8, 10


def rollout_batch(vocab: int, seed: int = 0) -> Batch:
    """N rows of left-padded prompts (3..8 tokens) and right-padded responses (1..10 tokens)."""
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(3, PROMPT + 1, (N,), generator=g)
    response_lens = torch.randint(1, RESPONSE + 1, (N,), generator=g)
    response_lens[0] = RESPONSE
    prompts = torch.zeros(N, PROMPT, dtype=torch.long)
    responses = torch.zeros(N, RESPONSE, dtype=torch.long)
    mask = torch.zeros(N, PROMPT + RESPONSE, dtype=torch.long)
    for i in range(N):
        p, r = int(prompt_lens[i]), int(response_lens[i])
        prompts[i, PROMPT - p :] = torch.randint(1, vocab, (p,), generator=g)
        responses[i, :r] = torch.randint(1, vocab, (r,), generator=g)
        mask[i, PROMPT - p : PROMPT + r] = 1
    return Batch(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": mask,
            "response_mask": mask[:, PROMPT:].float(),
        }
    )


def hf_reference(hf_dir: str, batch: Batch) -> dict[str, torch.Tensor]:
    """Per-token log-probs and entropy of the responses, and values/scores of a scalar-head model."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    scalar = "ForSequenceClassification" in AutoConfig.from_pretrained(hf_dir).architectures[0]
    cls = AutoModelForSequenceClassification if scalar else AutoModelForCausalLM
    model = cls.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out = {k: torch.zeros(N, RESPONSE) for k in ("log_probs", "entropy", "sum_pi_squared", "values")}
    out["scores"] = torch.zeros(N)
    with torch.no_grad():
        for i in range(N):
            real = batch["input_ids"][i][batch["attention_mask"][i].bool()]
            p = int(batch["attention_mask"][i, :PROMPT].sum())
            r = len(real) - p
            if scalar:
                token_scores = model.score(model.model(input_ids=real[None]).last_hidden_state)[0, :, 0]
                out["values"][i, :r] = token_scores[p - 1 : p - 1 + r]
                out["scores"][i] = token_scores[-1]
            else:
                logp = torch.log_softmax(model(input_ids=real[None]).logits[0].float(), dim=-1)
                rows = logp[p - 1 : p - 1 + r]
                out["log_probs"][i, :r] = rows.gather(1, real[p:, None])[:, 0]
                out["entropy"][i, :r] = -(rows.exp() * rows).sum(-1)
                out["sum_pi_squared"][i, :r] = (2 * rows).exp().sum(-1)
    return out


def config(policy: str, reward: str, tp: int, pp: int, **batching) -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = policy, "fp32"
    cfg.critic.model_path = reward  # a reward checkpoint has a trained head: its values are checkable
    cfg.reward.model_path = reward
    for role in (cfg.actor, cfg.critic, cfg.reward):
        role.parallel.tp, role.parallel.pp = tp, pp
        role.parallel.sequence_parallel = batching.get("sequence_parallel", False)
        role.micro_batch_size = batching.get("micro_batch_size", 2)
        role.max_tokens_per_micro_batch = batching.get("max_tokens")
    cfg.ref.micro_batch_size = 1
    for opt in (cfg.actor.optimizer, cfg.critic.optimizer):
        opt.lr, opt.weight_decay, opt.clip_grad = 1e-3, 0.0, 0.0
        opt.use_distributed_optimizer = False
    cfg.critic.optimizer.lr = 1e-4  # a regression target: small steps fall monotonically
    algo = cfg.algorithm
    algo.ppo_mini_batch_size, algo.ppo_epochs = N, 1
    return cfg


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def check_export(actor: WorkerGroup, policy: str) -> dict:
    """The live export before any update: the source's tensors bit for bit, in HF shards (collective)."""
    from safetensors.torch import load_file

    where = [tempfile.mkdtemp() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(where, src=0)
    out = Path(where[0]) / "hf"
    actor.export_hf(str(out))
    original, restored = load_file(Path(policy) / "model.safetensors"), HFCheckpointReader(out)
    exact = sorted(original) == sorted(restored.names()) and all(
        torch.equal(restored.get(n), t) for n, t in original.items()
    )
    files = sorted(p.name for p in out.iterdir())
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(where[0])
    return {"export_bit_exact": exact, "export_files": files}


def check_layout(name: str, policy: str, reward: str, batch: Batch, ref: dict, rm_ref: dict) -> dict:
    tp, pp = LAYOUTS[name]
    out: dict = {}
    mask = batch["response_mask"]

    cfg = config(policy, reward, tp, pp)
    roles = {
        "actor": (ActorWorker, {"spec": role_spec(cfg, "actor")}),
        "ref": (ReferenceWorker, {"spec": role_spec(cfg, "ref")}),
    }
    groups = make_colocated_groups("spmd", None, roles)
    actor, reference = groups["actor"], groups["ref"]
    # (the actor also answers ref_log_prob: with LoRA it is the reference, its adapters off)
    out["roles_scoped"] = not hasattr(reference, "update") and not hasattr(reference, "generate")
    lp = actor.log_prob(batch)
    out["log_prob_max_abs_diff"] = max_diff(lp["old_log_probs"], ref["log_probs"])
    out["entropy_max_abs_diff"] = max_diff(lp["entropy"], ref["entropy"])
    ref_future = reference.ref_log_prob_async(batch)
    out["ref_future_done"] = ref_future.done()
    out["ref_equals_actor"] = max_diff(ref_future.result()["ref_log_probs"], lp["old_log_probs"])
    out.update(check_export(actor, policy))

    # One optimizer step on a fixed batch; at the start ratio = 1, so the PPO loss is -token_mean(A).
    advantages = torch.randn(N, RESPONSE, generator=torch.Generator().manual_seed(1)) * mask
    train = batch.union(Batch(tensors={"old_log_probs": lp["old_log_probs"], "advantages": advantages}))
    metrics = actor.update(train)[0]
    out["pg_loss"] = metrics["actor/pg_loss"]
    out["hand_pg_loss"] = -(advantages.sum() / mask.sum()).item()
    out["grad_norm"] = metrics["grad_norm"]
    after = actor.log_prob(batch)["old_log_probs"]
    out["surrogate_after"] = ppo_clip_loss(after, lp["old_log_probs"], advantages, mask, 0.2, 0.2)[0].item()
    out["preference"] = check_preference(actor, batch)

    critic = make_worker_group("spmd", None, CriticWorker, "critic", {"spec": role_spec(cfg, "critic")})
    values = critic.values(batch)["values"]
    out["values_max_abs_diff"] = max_diff(values, rm_ref["values"])
    returns = torch.randn(N, RESPONSE, generator=torch.Generator().manual_seed(2)) * mask
    value_losses = []
    for _ in range(4):
        value_losses.append(
            critic.update(batch.union(Batch(tensors={"values": values, "returns": returns})))[0]
        )
    out["value_losses"] = [m["critic/vf_loss"] for m in value_losses]
    out["critic_grad_norm"] = value_losses[0]["grad_norm"]

    rm = make_worker_group("spmd", None, RewardModelWorker, "reward", {"spec": role_spec(cfg, "reward")})
    out["rm_score_max_abs_diff"] = max_diff(rm.compute_rm_score(batch)["rm_scores"], rm_ref["scores"])
    return out


def check_batching(policy: str, reward: str, batch: Batch, mask: torch.Tensor) -> dict:
    """tp2 (dp2) variants that must not change log-probs, loss or gradients: micro-batch size 1, packed
    token-budget micro-batches, rows reordered for DP token balance, activation recomputation, and
    sequence parallelism (where the LM head runs at every position and the response positions are
    picked from its logits, rather than picked from the hidden states before it)."""
    advantages = torch.randn(N, RESPONSE, generator=torch.Generator().manual_seed(1)) * mask
    variants = {
        "mbs1": ({"micro_batch_size": 1}, False),
        "packed": ({"max_tokens": 40}, False),  # THD: SDPA per run of equal lengths
        "packed_mask": ({"max_tokens": 40, "mask": True}, False),  # the block-causal mask fallback
        "packed_sp": ({"max_tokens": 40, "sequence_parallel": True}, False),
        "balanced": ({}, True),
        "recompute": ({"recompute": True}, False),
        "sequence_parallel": ({"sequence_parallel": True}, False),
    }
    out = {}
    for label, (batching, balance) in variants.items():
        cfg = config(policy, reward, 2, 1, **batching)
        cfg.model.gradient_checkpointing = batching.get("recompute", False)
        if label == "mbs1":  # offloads to disk (check_offload); a directory of its own for each rank
            cfg.actor.offload_dir = tempfile.mkdtemp()
        actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
        if batching.get("mask"):
            actor.worker.packed_thd = False  # as where the attention cannot take THD (attention dropout)
        rows, order = batch, list(range(N))
        if balance:
            rows, order = balance_for_dp(batch, actor.worker.layout.dp)
        lp = torch.zeros(N, RESPONSE)
        lp[order] = actor.log_prob(rows)["old_log_probs"]
        train = batch.union(Batch(tensors={"old_log_probs": lp, "advantages": advantages}))
        metrics = actor.update(train.reorder(order))[0]
        out[label] = {"log_probs": lp, "pg_loss": metrics["actor/pg_loss"], "grad_norm": metrics["grad_norm"]}
        mb = actor.worker.microbatches(sequences_from_batch(batch), list(range(N // 2)))[0]
        out[label]["packed_as"] = "thd" if "cu_seqlens" in mb else "mask" if "attention_mask" in mb else "pad"
        if label == "mbs1":
            out[label]["offload"] = check_offload(actor, batch, lp)
        if not balance:  # reordered rows would split the pairs
            out[label]["preference"] = check_preference(actor, batch)
        if balance:
            tokens = [batch["attention_mask"][idx].sum().item() for idx in (order[: N // 2], order[N // 2 :])]
            out[label]["dp_tokens"] = tokens
    return out


def check_fused_old_log_prob(policy: str, reward: str, batch: Batch, advantages: torch.Tensor) -> dict:
    """algorithm.old_log_prob=fused at tp2 (dp2): an update fed the engine's log-probs instead of old
    ones takes the old log-probs from its own forward, and logs the train/rollout mismatch; one fed no
    engine log-probs (rollout.calculate_log_probs=false) gives the same update without that metric."""
    cfg = config(policy, reward, 2, 1)
    cfg.algorithm.old_log_prob = "fused"
    actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    without = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    mask = batch["response_mask"]
    lp = actor.log_prob(batch)["old_log_probs"]  # what the update's forward will compute
    noise = torch.rand(N, RESPONSE, generator=torch.Generator().manual_seed(4)) * 0.01
    rollout = (lp + noise) * mask
    metrics = actor.update(
        batch.union(Batch(tensors={"rollout_log_probs": rollout, "advantages": advantages}))
    )[0]
    plain = without.update(batch.union(Batch(tensors={"advantages": advantages})))[0]
    diff = (lp - rollout).abs()[mask > 0]
    return {
        "pg_loss": metrics["actor/pg_loss"],
        "grad_norm": metrics["grad_norm"],
        "without_rollout": {
            "pg_loss": plain["actor/pg_loss"],
            "grad_norm": plain["grad_norm"],
            "metrics": sorted(k for k in plain if "rollout" in k),
        },
        "diff_mean": metrics["actor/train_rollout_logprob_abs_diff"],
        "diff_max": metrics["actor/train_rollout_logprob_abs_diff_max"],
        "expected_diff_mean": diff.mean().item(),
        "expected_diff_max": diff.max().item(),
    }


def check_loss_wiring(policy: str, reward: str, batch: Batch, ref: dict) -> dict:
    """At tp2 (dp2): the optimal token baseline's Σπ² comes out of the actor's log-prob pass, and an
    update with another loss (SAPO with a policy_loss_params override, its auto loss_agg_mode) and
    rollout IS weights gives the loss the pure function gives on the same inputs."""
    mask = batch["response_mask"]
    cfg = config(policy, reward, 2, 1)
    algo = cfg.algorithm
    algo.name, algo.adv_estimator, algo.policy_loss = "grpo", "optimal_token_baseline", "sapo"
    algo.policy_loss_params = {"tau_pos": 2.0}
    actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    lp = actor.log_prob(batch)
    g = torch.Generator().manual_seed(3)
    advantages = torch.randn(N, RESPONSE, generator=g) * mask
    weights = (torch.rand(N, RESPONSE, generator=g) * 2) * mask
    columns = {"old_log_probs": lp["old_log_probs"], "advantages": advantages, "rollout_is_weights": weights}
    metrics = actor.update(batch.union(Batch(tensors=columns)))[0]
    expected, _ = sapo_loss(
        lp["old_log_probs"], lp["old_log_probs"], advantages, mask, 0.2, 0.2,
        rollout_is_weights=weights, agg_mode="seq-mean-token-mean", tau_pos=2.0,
    )  # fmt: skip
    return {
        "sum_pi_squared_max_abs_diff": max_diff(lp["sum_pi_squared"], ref["sum_pi_squared"]),
        "sapo_pg_loss": metrics["actor/pg_loss"],
        "sapo_expected": expected.item(),
    }


def check_offload(actor: WorkerGroup, batch: Batch, before: torch.Tensor) -> dict:
    """Offload params, grads and optimizer state to disk (the actor's offload_dir); the worker refuses
    to compute meanwhile, and after reload its log-probs are bit-identical to those before offloading."""
    before = actor.log_prob(batch)["old_log_probs"]
    reports = actor.offload(params=True, grads=True, optimizer=True)[dist.get_rank()]
    try:
        actor.log_prob(batch)
        refused = "no error"
    except WorkerError as e:
        refused = str(e).splitlines()[0]
    reloaded = actor.reload()[dist.get_rank()]
    after = actor.log_prob(batch)["old_log_probs"]
    return {
        "offloaded": {r["state"]: r["bytes"] for r in reports},
        "reloaded": {r["state"]: r["bytes"] for r in reloaded},
        "rss_freed": sum(r["device_bytes_freed"] for r in reports),
        "refused": refused,
        "bit_exact": bool(torch.equal(after, before)),
    }


def main(argv: list[str]) -> dict:
    policy, reward, parts = argv
    from transformers import AutoConfig

    batch = rollout_batch(AutoConfig.from_pretrained(policy).vocab_size)
    ref = hf_reference(policy, batch)
    results: dict = {}
    for part in parts.split(","):
        found = (
            layouts(policy, reward, batch, ref) if part == "layouts" else batching(policy, reward, batch, ref)
        )
        assert not found.keys() & results.keys(), found.keys() & results.keys()
        results.update(found)
    return results


def layouts(policy: str, reward: str, batch: dict, ref: dict) -> dict:
    rm_ref = hf_reference(reward, batch)
    return {name: check_layout(name, policy, reward, batch, ref, rm_ref) for name in LAYOUTS}


def batching(policy: str, reward: str, batch: dict, ref: dict) -> dict:
    results = {
        label: {
            "log_prob_max_abs_diff": max_diff(b["log_probs"], ref["log_probs"]),
            "pg_loss": b["pg_loss"],
            "grad_norm": b["grad_norm"],
            **{k: b[k] for k in ("dp_tokens", "offload", "preference", "packed_as") if k in b},
        }
        for label, b in check_batching(policy, reward, batch, batch["response_mask"]).items()
    }
    results["loss_wiring"] = check_loss_wiring(policy, reward, batch, ref)
    advantages = torch.randn(N, RESPONSE, generator=torch.Generator().manual_seed(1)) * batch["response_mask"]
    results["fused"] = check_fused_old_log_prob(policy, reward, batch, advantages)
    return results
