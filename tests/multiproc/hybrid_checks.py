"""Rank code for test_hybrid_engine: train -> reshard -> generate -> recompute, on 4 ranks.

argv: MODEL CASE [CASE ...], a case being "t2p2g1" (training TP 2, PP 2, generation TP 1), with a suffix
"a" for LoRA synced as adapters (the base once, then each engine rank its adapter region) or "m" for LoRA
merged into the base weights (then only the targeted linears move). For each case
the actor generates, recomputes the log-probs of the sampled tokens with Megatron, and takes an
optimizer step, STEPS times; after every sync the engine's log-probs must equal Megatron's, so the engine
really runs the updated weights. Rank 0 reports per case.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist

from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.controller.group import make_worker_group
from megarl.protocol import Batch
from megarl.workers.actor import ActorWorker

# 2 steps: the first sync moves every base tensor, the second follows an update (what the checks are about)
N_PROMPTS, SAMPLES, PROMPT, RESPONSE, STEPS = 4, 2, 8, 10, 2
TOKENIZER_VOCAB = 657  # prompts stay inside the tiny tokenizer's vocabulary


def prompts() -> Batch:
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(N_PROMPTS, PROMPT, dtype=torch.long)
    mask = torch.zeros(N_PROMPTS, PROMPT, dtype=torch.long)
    for i, length in enumerate([3, 8, 5, 6]):
        ids[i, PROMPT - length :] = torch.randint(3, TOKENIZER_VOCAB, (length,), generator=g)
        mask[i, PROMPT - length :] = 1
    return Batch(tensors={"prompts": ids, "attention_mask": mask})


def config(model: str, tp: int, pp: int, gen_tp: int, lora: str = "") -> MegarlConfig:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = model, "fp32"
    cfg.data.max_prompt_length, cfg.data.max_response_length = PROMPT, RESPONSE
    cfg.actor.parallel.tp, cfg.actor.parallel.pp = tp, pp
    cfg.actor.micro_batch_size = 2
    opt = cfg.actor.optimizer
    opt.lr, opt.weight_decay, opt.clip_grad, opt.use_distributed_optimizer = 1e-3, 0.0, 0.0, False
    cfg.actor.offload_optimizer = cfg.actor.offload_grads = True  # exercised around every generate
    r = cfg.rollout
    r.tp, r.n, r.temperature, r.seed = gen_tp, SAMPLES, 1.0, 7
    r.kv_cache_memory_bytes, r.max_num_seqs, r.enforce_eager = 16 << 20, 16, True
    r.reshard_bucket_mib = 1
    cfg.algorithm.ppo_mini_batch_size, cfg.algorithm.ppo_epochs = N_PROMPTS, 1
    if lora:
        cfg.actor.lora.rank, cfg.actor.lora.alpha, cfg.actor.lora.check_sync = 8, 16, True
        cfg.actor.lora.sync = {"a": "adapter", "m": "merged"}[lora]
        opt.lr = 1e-2  # B starts at 0: a larger step, so one update visibly moves the policy
        if tp > 2:  # TP above the 2 key/value heads: q/k/v cannot carry adapters there
            cfg.actor.lora.exclude_modules = ["linear_qkv"]
    return cfg


def run_case(model: str, case: str) -> dict:
    tp, pp, gen_tp, lora = re.fullmatch(r"t(\d)p(\d)g(\d)([am]?)", case).groups()
    spec = role_spec(config(model, int(tp), int(pp), int(gen_tp), lora), "actor")
    actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": spec})
    diffs, ratios, changed, seconds, moved = [], [], [], [], []
    previous = None
    for step in range(STEPS):
        out = actor.generate(prompts())
        mask = out["response_mask"]
        recomputed = actor.log_prob(out)["old_log_probs"]
        diffs.append(((recomputed - out["rollout_log_probs"]).abs() * mask).max().item())
        stats = actor.worker.hybrid.last_stats
        ratio = torch.tensor([stats.received_bytes, stats.floor_bytes], dtype=torch.float64)
        everyone = [torch.zeros_like(ratio) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, ratio)
        ratios.append([float(r[0] / r[1]) if r[1] else float(r[0] == 0) for r in everyone])
        moved.append(
            {"received": stats.received_bytes, "adapter": stats.adapter_bytes, "tensors": stats.tensors}
        )
        seconds.append(out.meta["hybrid_engine"]["seconds"])
        if previous is not None:  # the update of the last step moved the log-probs of its rollouts
            before, batch = previous
            after = actor.log_prob(batch)["old_log_probs"]
            changed.append(((after - before).abs() * batch["response_mask"]).max().item())
        advantages = torch.randn(mask.shape, generator=torch.Generator().manual_seed(step)) * mask
        actor.update(out.union(Batch(tensors={"old_log_probs": recomputed, "advantages": advantages})))
        previous = (recomputed, out)
    result = {
        "max_abs_logprob_diff": diffs,
        "bytes_over_floor": ratios,
        "moved": moved,  # this rank's sync of each step: bytes received, adapter bytes for its engine
        "update_moved_logprobs": changed,
        "engine_groups": actor.worker.hybrid.tp_groups,
        "engine_ranks": actor.worker.hybrid.rollout.tp_ranks,
        "responses": int(out["response_mask"].sum()),
        "seconds": seconds[-1],
    }
    actor.worker.hybrid.close()  # vLLM's groups go before megatron re-initialises for the next case
    actor.worker.hybrid = None
    return result


def main(argv: list[str]) -> dict:
    model, cases = argv[0], argv[1:]
    results = {case: run_case(model, case) for case in cases}
    ranks: list = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, {c: r["engine_ranks"] for c, r in results.items()})
    for case in cases:
        results[case]["engine_ranks"] = [r[case] for r in ranks]
    return results
