"""Rank code for test_tiny_archs: megarl's vLLM engine (VLLMRollout) against transformers fp32 on the tiny
architectures only the FSDP backend trains (megarl.models.tiny.HF_ONLY_FAMILIES), one engine after the
other in this one process (an engine start is the expensive part).

argv: ROOT FAMILY [FAMILY ...]. Per family: greedy tokens and log-probs of the engine vs transformers,
sampled log-probs at temperature 1, then a push of another seed's weights by their Hugging Face names (what
an FSDP actor sends after an update) and the same comparison against that model.
"""

from __future__ import annotations

import time

import torch

from megarl.models.tiny import build_tiny_hf
from tests.multiproc.vllm_rollout_checks import (
    RESPONSE,
    config,
    hf_log_probs,
    hf_model,
    max_diff,
    prompt_batch,
)


def hf_greedy(model, batch) -> list[list[int]]:
    """transformers' greedy continuation of each (unpadded) prompt, RESPONSE tokens, argmax step by step."""
    out = []
    with torch.no_grad():
        for prompt, mask in zip(batch["prompts"], batch["attention_mask"]):
            ids = prompt[mask.bool()][None]
            for _ in range(RESPONSE):
                ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
            out.append(ids[0, -RESPONSE:].tolist())
    return out


def compare(rollout, hf, batch, cfg) -> dict:
    greedy = rollout.generate(batch, cfg.rollout.val)
    sampled = rollout.generate(batch, cfg.rollout)
    return {
        "greedy_tokens": greedy["responses"].tolist(),
        "hf_greedy_tokens": hf_greedy(hf, batch),
        "greedy_log_prob_diff": max_diff(greedy["rollout_log_probs"], hf_log_probs(hf, greedy)),
        "sampled_log_prob_diff": max_diff(sampled["rollout_log_probs"], hf_log_probs(hf, sampled)),
    }


def check_family(root: str, family: str) -> dict:
    from megarl.rollout.vllm import VLLMRollout

    path = str(build_tiny_hf(f"{root}/{family}", family=family))
    other = str(build_tiny_hf(f"{root}/{family}_seed1", family=family, seed=1))
    cfg, batch = config(path, tp=1), prompt_batch()
    res: dict = {}
    t0 = time.time()
    rollout = VLLMRollout(cfg)
    res["engine_start_s"] = time.time() - t0
    try:
        res["built"] = compare(rollout, hf_model(path), batch, cfg)
        pushed = hf_model(other)
        res["push_loader"] = rollout.load_weights(pushed.named_parameters())
        res["pushed"] = compare(rollout, pushed, batch, cfg)
    finally:
        rollout.close()
    res["seconds"] = time.time() - t0
    return res


def registry_read_matches() -> dict:
    """megarl.fsdp.checks reads vLLM's registry from its source; the imported registry must agree."""
    from vllm.model_executor.models import registry

    from megarl.fsdp.checks import vllm_architectures

    read = vllm_architectures()
    generative = {**registry._TEXT_GENERATION_MODELS, **registry._MULTIMODAL_MODELS}
    native = {arch for arch, (module, _) in generative.items() if module != "transformers"}
    return {
        "native": read is not None and read.native == native,
        "fallback": read is not None and read.fallback == set(registry._TRANSFORMERS_SUPPORTED_MODELS),
    }


def main(argv: list[str]) -> dict:
    root, *families = argv
    return {"registry_read_matches": registry_read_matches()} | {f: check_family(root, f) for f in families}
