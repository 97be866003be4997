"""Rank code for test_vllm_moe: VLLMRollout on tiny mixture-of-experts checkpoints against transformers fp32.
argv: MODEL... (one per family). One engine TP group over every rank (the test: 1 rank; the same program
under 2 ranks checks TP2; rank 0 reports). For each model: greedy tokens and log-probs; the routes the
engine recorded (R3: `return_routes`) against the top-k of transformers' router logits, with n = 2 sampled
responses per prompt; then weights moved by ~5% pushed through `VLLMRollout.load_weights` (the sync path,
whose per-expert tensors go to vLLM's `reload_weights`), and the same against transformers with them; a push
of part of a layer's experts first, which must be refused.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from megarl.config.schema import SamplingConfig
from megarl.protocol import Batch, Col
from tests.multiproc.vllm_rollout_checks import (
    RESPONSE,
    config,
    hf_log_probs,
    hf_model,
    max_diff,
    prompt_batch,
)


def _perturbed(model, out: Path, seed: int = 1) -> dict[str, torch.Tensor]:
    """Move every weight of `model` by ~5% of its mean magnitude (in place, alike on every rank); returns the
    tensors under their checkpoint names (as rank 0's save_pretrained writes them into `out`: what a weight
    sync sends)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=g))
    model.save_pretrained(out)  # rank 0 only
    dist.barrier()
    return dict(load_file(out / "model.safetensors"))


def _hf_greedy(model, batch: Batch) -> list[list[int]]:
    with torch.no_grad():
        return [
            model.generate(row[m.bool()][None], max_new_tokens=RESPONSE, do_sample=False)[
                0, int(m.sum()) :
            ].tolist()
            for row, m in zip(batch["prompts"], batch["attention_mask"])
        ]


def _tokens(out: Batch) -> list[list[int]]:
    return [r[m.bool()].tolist() for r, m in zip(out["responses"], out["response_mask"])]


def _route_report(model, out: Batch) -> dict:
    """The recorded routes against transformers' top-k (as sets: sorted) at every forwarded position of every
    row, and whether every other position holds -1."""
    topk = model.config.num_experts_per_tok
    routes = out[Col.ROUTED_EXPERTS]
    positions = equal = 0
    sentinel_elsewhere = True
    with torch.no_grad():
        for i in range(len(out)):
            real = out["attention_mask"][i].bool().nonzero().flatten()
            forwarded = real[:-1]  # the last token is sampled, never forwarded
            logits = model(input_ids=out["input_ids"][i, real][None], output_router_logits=True).router_logits
            hf = torch.stack([layer.topk(topk, -1).indices for layer in logits], 1)[:-1].sort(-1).values
            mine = routes[i, forwarded].long().sort(-1).values
            positions += len(forwarded)
            equal += int((mine == hf).all(-1).all(-1).sum())
            rest = torch.ones(routes.shape[1], dtype=torch.bool)
            rest[forwarded] = False
            sentinel_elsewhere &= bool((routes[i, rest] == -1).all())
    return {
        "shape": list(routes.shape),
        "dtype": str(routes.dtype),
        "positions": positions,
        "equal": equal,
        "sentinel_elsewhere": sentinel_elsewhere,
    }


def _generations(rollout, hf, batch: Batch) -> dict:
    greedy = rollout.generate(batch, SamplingConfig(n=1, temperature=0.0, max_tokens=RESPONSE))
    sampled = rollout.generate(batch, SamplingConfig(n=2, temperature=1.0, max_tokens=RESPONSE))
    return {
        "greedy_tokens_equal": _tokens(greedy) == _hf_greedy(hf, batch),
        "greedy_log_prob_diff": max_diff(greedy["rollout_log_probs"], hf_log_probs(hf, greedy)),
        "sampled_log_prob_diff": max_diff(sampled["rollout_log_probs"], hf_log_probs(hf, sampled)),
        "greedy_routes": _route_report(hf, greedy),
        "sampled_routes": _route_report(hf, sampled),
    }


def check_model(model: str) -> dict:
    from megarl.rollout.vllm import VLLMRollout

    batch = prompt_batch()
    rollout = VLLMRollout(dataclasses.replace(config(model, tp=dist.get_world_size()), return_routes=True))
    hf = hf_model(model)
    res = {
        "prefix_caching": rollout.engine_kwargs["enable_prefix_caching"],
        "before": _generations(rollout, hf, batch),
    }
    weights = _perturbed(hf, Path(f"{model}-synced"))
    try:  # one expert of each layer: the rest of the layer must come in the same call
        rollout.load_weights((k, v) for k, v in weights.items() if ".experts.0." in k)
        res["part_of_the_experts"] = None
    except ValueError as e:
        res["part_of_the_experts"] = str(e)
    res["loader"] = rollout.load_weights(weights.items())
    res["after"] = _generations(rollout, hf, batch)
    rollout.close()
    return res


def main(argv: list[str]) -> dict:
    return {Path(model).name: check_model(model) for model in argv}
