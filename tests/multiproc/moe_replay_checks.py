"""Rank code for test_moe_replay: routing replay through the actor and reference workers on 4 ranks.

argv: MOE_HF. A tiny Qwen3-MoE; a rollout batch whose `routed_experts` are random (distinct top-2 per
token), with -1 at padding and at one row's every token in one layer (routed live there). For every
layout (DP, EP2, TP2×EP2 with SP, PP2, PP2×EP2; padded and packed micro-batches), through the "spmd"
worker groups:
  - R3 old log-probs vs transformers fp32 forced to the same routes (its routers' top-k replaced; the
    gating weights recomputed as its router would: softmax, the chosen experts, renormalised), and the
    routers' live choices vs transformers' own top-k;
  - the reference (the same model) replays the same routes: its log-probs equal the actor's;
  - one update on the replayed routes: at the start the new and old log-probs must agree, so the PPO
    KL and clip fraction are 0 only if the update's forwards took the same experts;
  - R2: the routes the old-log-prob forward records equal transformers' top-k at every real token.
"""

from __future__ import annotations

import contextlib

import torch

from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.controller.group import make_worker_group
from megarl.protocol import Batch, Col
from megarl.workers.actor import ActorWorker
from megarl.workers.reference import ReferenceWorker
from megarl.workers.routes import LIVE_ROUTES
from tests.multiproc.policy_checks import PROMPT, N, rollout_batch

# name -> (tp, pp, ep, sequence_parallel, max_tokens_per_micro_batch)
LAYOUTS = {
    "dp4": (1, 1, 1, False, None),
    "ep2_packed": (1, 1, 2, False, 40),
    "tp2ep2sp_packed": (2, 1, 2, True, 40),
    "pp2": (1, 2, 1, False, None),
    "pp2ep2_packed": (1, 2, 2, False, 40),
}


def random_routes(batch: Batch, layers: int, experts: int, topk: int, seed: int = 3) -> torch.Tensor:
    """[n, P+R, layers, topk] distinct random experts per token, -1 on padding and on row 1 in layer 0."""
    g = torch.Generator().manual_seed(seed)
    n, width = batch[Col.ATTENTION_MASK].shape
    scores = torch.rand(n, width, layers, experts, generator=g)
    routes = scores.topk(topk, dim=-1).indices.to(torch.int16)
    routes[~batch[Col.ATTENTION_MASK].bool()] = -1
    routes[1, :, 0] = -1
    return routes


@contextlib.contextmanager
def forced_hf_routes(model, routes_of_layer: dict[int, torch.Tensor], live_of_layer: dict):
    """transformers' Qwen3-MoE routers replaced by the given routes [tokens, topk] per layer (-1 rows:
    its own top-k), the weights as its router computes them for the chosen experts; what each router
    would have chosen goes to `live_of_layer`."""
    hooks = []
    for i, layer in enumerate(model.model.layers):
        gate = layer.mlp.gate

        def hook(module, args, output, i=i):
            logits, _, live = output
            live_of_layer[i] = live
            forced = routes_of_layer[i].to(live.dtype)
            chosen = torch.where((forced < 0).any(dim=-1, keepdim=True), live, forced)
            values = torch.softmax(logits.float(), dim=-1).gather(1, chosen)
            if module.norm_topk_prob:
                values = values / values.sum(dim=-1, keepdim=True)
            return logits, values.to(logits.dtype), chosen

        hooks.append(gate.register_forward_hook(hook))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def hf_reference(hf_dir: str, batch: Batch, routes: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' response log-probs with the routes forced, and its own live top-k per token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    width = batch[Col.RESPONSES].shape[1]
    out = {
        "log_probs": torch.zeros(N, width),
        "live": torch.full_like(routes, -1),  # its own routes
        "live_forced": torch.full_like(routes, -1),  # what its routers choose on the forced forward
    }
    with torch.no_grad():
        for i in range(N):
            real_mask = batch[Col.ATTENTION_MASK][i].bool()
            real = batch[Col.INPUT_IDS][i][real_mask]
            p = int(batch[Col.ATTENTION_MASK][i, :PROMPT].sum())
            live = model(input_ids=real[None], output_router_logits=True).router_logits
            k = model.config.num_experts_per_tok
            out["live"][i][real_mask] = torch.stack(
                [logits.topk(k, dim=-1).indices for logits in live], dim=1
            ).to(routes.dtype)
            per_layer = {layer: routes[i][real_mask][:, layer] for layer in range(routes.shape[2])}
            chosen: dict[int, torch.Tensor] = {}
            with forced_hf_routes(model, per_layer, chosen):
                logp = torch.log_softmax(model(input_ids=real[None]).logits[0].float(), dim=-1)
            out["live_forced"][i][real_mask] = torch.stack([chosen[j] for j in sorted(chosen)], dim=1).to(
                routes.dtype
            )
            r = len(real) - p
            out["log_probs"][i, :r] = logp[p - 1 : p - 1 + r].gather(1, real[p:, None])[:, 0]
    return out


def config(
    hf_dir: str, mode: str, tp: int, pp: int, ep: int, sp: bool, max_tokens: int | None
) -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = hf_dir, "fp32"
    cfg.actor.router_replay.mode = mode
    p = cfg.actor.parallel
    p.tp, p.pp, p.ep, p.sequence_parallel = tp, pp, ep, sp
    cfg.actor.micro_batch_size, cfg.actor.max_tokens_per_micro_batch = 2, max_tokens
    cfg.ref.micro_batch_size = 1
    opt = cfg.actor.optimizer
    opt.lr, opt.weight_decay, opt.clip_grad, opt.use_distributed_optimizer = 1e-3, 0.0, 0.0, False
    cfg.algorithm.ppo_mini_batch_size, cfg.algorithm.ppo_epochs = N, 1
    return cfg


def check_layout(hf_dir: str, name: str, batch: Batch, hf: dict) -> dict:
    tp, pp, ep, sp, max_tokens = LAYOUTS[name]
    mask = batch[Col.RESPONSE_MASK]
    real = batch[Col.ATTENTION_MASK].bool()
    out = {}
    cfg = config(hf_dir, "R3", tp, pp, ep, sp, max_tokens)
    actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    lp = actor.log_prob(batch)
    out["r3_log_prob_vs_forced_hf"] = (lp[Col.OLD_LOG_PROBS] - hf["log_probs"]).abs().max().item()
    live = lp[LIVE_ROUTES]
    # what the routers would have chosen under the replayed routes (R3's disagreement metric)
    out["live_routes_equal_hf_topk"] = bool(
        torch.equal(live[real].sort(-1).values, hf["live_forced"][real].sort(-1).values)
    )
    out["live_routes_pad_missing"] = bool((live[~real] == -1).all())
    reference = make_worker_group("spmd", None, ReferenceWorker, "ref", {"spec": role_spec(cfg, "ref")})
    ref = reference.ref_log_prob(batch)[Col.REF_LOG_PROBS]
    out["ref_vs_actor"] = (ref - lp[Col.OLD_LOG_PROBS]).abs().max().item()
    advantages = torch.randn(N, mask.shape[1], generator=torch.Generator().manual_seed(1)) * mask
    train = batch.union(Batch(tensors={Col.OLD_LOG_PROBS: lp[Col.OLD_LOG_PROBS], Col.ADVANTAGES: advantages}))
    metrics = actor.update(train)[0]
    out["update_ppo_kl"] = abs(metrics["actor/ppo_kl"])
    out["update_clip_frac"] = metrics["actor/pg_clipfrac"]
    out["update_grad_norm"] = metrics["grad_norm"]

    r2 = config(hf_dir, "R2", tp, pp, ep, sp, max_tokens)
    actor2 = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(r2, "actor")})
    plain = batch.select([Col.INPUT_IDS, Col.ATTENTION_MASK, Col.RESPONSES, Col.RESPONSE_MASK])
    recorded = actor2.log_prob(plain)[Col.ROUTED_EXPERTS]
    out["r2_recorded_equal_hf_topk"] = bool(
        torch.equal(recorded[real].sort(-1).values, hf["live"][real].sort(-1).values)
    )
    out["r2_recorded_pad_missing"] = bool((recorded[~real] == -1).all())
    return out


def perturbed_engine(hf_dir: str, batch: Batch, noise: float, seed: int = 5) -> dict[str, torch.Tensor]:
    """An "engine" that routes a little differently than the trainer (as kernels and reduction orders
    make real engines do): transformers with its routers' weights perturbed by `noise`·std, every other
    weight the same. Its response log-probs and its routes [n, P+R, L, k] (-1 on padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.gate.weight
            w.add_(torch.randn(w.shape, generator=g) * noise * w.std())
    k, layers = model.config.num_experts_per_tok, len(model.model.layers)
    mask = batch[Col.ATTENTION_MASK]
    out = {
        "log_probs": torch.zeros(N, batch[Col.RESPONSES].shape[1]),
        "routes": torch.full((*mask.shape, layers, k), -1, dtype=torch.int16),
    }
    with torch.no_grad():
        for i in range(N):
            real_mask = mask[i].bool()
            real = batch[Col.INPUT_IDS][i][real_mask]
            p = int(mask[i, :PROMPT].sum())
            result = model(input_ids=real[None], output_router_logits=True)
            out["routes"][i][real_mask] = torch.stack(
                [logits.topk(k, dim=-1).indices for logits in result.router_logits], dim=1
            ).to(torch.int16)
            logp = torch.log_softmax(result.logits[0].float(), dim=-1)
            out["log_probs"][i, : len(real) - p] = logp[p - 1 : -1].gather(1, real[p:, None])[:, 0]
    return out


def check_r3_effect(hf_dir: str, batch: Batch, noise: float = 0.05) -> dict:
    """Train/rollout log-prob differences against an engine that routes ~differently, with and without
    replaying its routes (EP2, packed), and the share of tokens the trainer routes otherwise."""
    from megarl.models.moe_replay import disagreement

    engine = perturbed_engine(hf_dir, batch, noise)
    mask, real = batch[Col.RESPONSE_MASK] > 0, batch[Col.ATTENTION_MASK].bool()
    plain = batch.select([Col.INPUT_IDS, Col.ATTENTION_MASK, Col.RESPONSES, Col.RESPONSE_MASK])
    cfg = config(hf_dir, "R3", *LAYOUTS["ep2_packed"])
    actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
    live = actor.log_prob(plain)  # no routes: routed live
    replayed = actor.log_prob(plain.union(Batch(tensors={Col.ROUTED_EXPERTS: engine["routes"]})))
    out = {"noise": noise}
    for name, lp in (("without_r3", live), ("with_r3", replayed)):
        diff = (lp[Col.OLD_LOG_PROBS] - engine["log_probs"])[mask].abs()
        out[f"{name}_abs_diff_mean"], out[f"{name}_abs_diff_max"] = diff.mean().item(), diff.max().item()
    shares = disagreement(live[LIVE_ROUTES][real], engine["routes"][real])
    out["disagreement_token_share"] = shares["token_share"]
    out["disagreement_layer_token_share"] = shares["layer_token_share"]
    return out


def main(argv: list[str]) -> dict:
    hf_dir = argv[0]
    from megarl.models.from_hf import ModelArchitecture

    arch = ModelArchitecture.from_pretrained(hf_dir)
    batch = rollout_batch(arch.vocab_size)
    routes = random_routes(batch, arch.num_layers, arch.num_experts, arch.moe_topk)
    batch = batch.union(Batch(tensors={Col.ROUTED_EXPERTS: routes}))
    hf = hf_reference(hf_dir, batch, routes)
    results = {name: check_layout(hf_dir, name, batch, hf) for name in LAYOUTS}
    results["r3_effect"] = check_r3_effect(
        hf_dir, batch.select([k for k in batch.tensors.keys() if k != Col.ROUTED_EXPERTS])
    )
    return results
