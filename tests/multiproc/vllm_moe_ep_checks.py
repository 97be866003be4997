"""Rank code for test_vllm_moe_ep (2 ranks): a megatron Qwen3-MoE trained at TP2 pushes its weights through
the 3D-HybridEngine's resharder into a vLLM engine at TP2 with expert parallelism
(rollout.expert_parallel_size=2: each rank holds 2 of the 4 experts whole, on CPU with vllm_moe's
`local_expert_ids_on_cpu` shim). The engine starts from other weights (ENGINE_HF) and, after the push,
generates what transformers generates with the trained ones (TRAINED_HF); each rank received exactly the
plan's floor. argv: ENGINE_HF TRAINED_HF.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig, SamplingConfig
from megarl.distributed.generation_plan import GenerationPlan
from megarl.hybrid.reshard import Resharder, ReshardStats
from megarl.workers.reference import ReferenceWorker
from tests.multiproc.vllm_moe_checks import _hf_greedy, _tokens
from tests.multiproc.vllm_rollout_checks import (
    RESPONSE,
    config,
    hf_log_probs,
    hf_model,
    max_diff,
    prompt_batch,
)


def main(argv: list[str]) -> dict:
    from megarl.rollout.vllm import VLLMRollout

    engine_hf, trained_hf = argv
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype, cfg.actor.parallel.tp = trained_hf, "fp32", 2
    worker = ReferenceWorker(role_spec(cfg, "ref"))
    plan = GenerationPlan.for_layout(worker.layout, 2, worker.arch.num_kv_heads, gen_ep=True)
    resharder = Resharder(worker.chunks, worker.arch, plan, bucket_bytes=256 << 10)
    spec = config(engine_hf, tp=2)
    spec = dataclasses.replace(spec, rollout=dataclasses.replace(spec.rollout, expert_parallel_size=2))
    rollout = VLLMRollout(spec, plan.gen_tp_groups)
    experts = {layer: len(names) for layer, names in rollout.layers.items() if ".experts." in layer}
    hf, batch = hf_model(trained_hf), prompt_batch()
    greedy = SamplingConfig(n=1, temperature=0.0, max_tokens=RESPONSE)
    before = rollout.generate(batch, greedy)
    stats = ReshardStats()
    for bucket in resharder.buckets(stats):
        rollout.load_weights(bucket)
    after = rollout.generate(batch, greedy)
    rollout.close()
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, (stats.received_bytes, stats.floor_bytes, stats.buckets))
    return {
        "engine_block": list(plan.engine_experts(dist.get_rank(), worker.arch.num_experts)),
        "engine_expert_tensors_per_layer": sorted(set(experts.values())),
        "before_log_prob_diff": max_diff(before["rollout_log_probs"], hf_log_probs(hf, before)),
        "greedy_tokens_equal": _tokens(after) == _hf_greedy(hf, batch),
        "greedy_log_prob_diff": max_diff(after["rollout_log_probs"], hf_log_probs(hf, after)),
        "received": [r for r, _, _ in per_rank],
        "floor": [f for _, f, _ in per_rank],
        "buckets": [b for _, _, b in per_rank],
    }
