"""Rank code for test_fsdp_sync: an FSDP2 actor's shards -> each rank's engine region of every HF tensor.

argv: MODEL_DIR... (tiny HF models: Qwen2 has q/k/v biases and tied embeddings, Llama an untied lm_head;
vocab 1001 does not chunk evenly over the world). Each model is wrapped by `fully_shard` (every decoder
layer, then the root) over the whole world; FSDPWeightSync runs at every rollout.tp dividing the world
(at world 4, rollout.tp=4 replicates each of the 2 key/value heads on 2 engine ranks), zero-redundancy
and naive. Each rank compares only its engine region of each tensor (what vLLM's loader reads, written
here from vLLM's layers independently of the plan) with the HF checkpoint, bit for bit, and counts bytes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megarl.distributed.fsdp_plan import FSDPGenerationPlan
from megarl.fsdp.weight_sync import FSDPWeightSync
from megarl.hybrid.reshard import ReshardStats


def engine_region(name: str, full: torch.Tensor, g: int, t: int, kv_heads: int) -> torch.Tensor:
    """The part of HF tensor `name` that engine TP rank g of t loads (vLLM's sharding)."""
    leaf = name.split(".")[-2]
    if t == 1 or "norm" in leaf or (leaf in ("o_proj", "down_proj") and name.endswith("bias")):
        return full
    if leaf in ("embed_tokens", "lm_head"):
        rows = -(-full.shape[0] // 64) * 64 // t  # vLLM pads the vocabulary to a multiple of 64
        return full[g * rows : (g + 1) * rows]
    if leaf in ("k_proj", "v_proj") and t > kv_heads:
        return full.chunk(kv_heads, dim=0)[g // (t // kv_heads)]  # each kv head on t/kv_heads ranks
    if leaf in ("o_proj", "down_proj"):
        return full.chunk(t, dim=1)[g]
    return full.chunk(t, dim=0)[g]


def wrap(model_dir: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor], dict]:
    """The HF model under FSDP2 over the world, its full weights before wrapping, and its config."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    full = {name: p.detach().clone() for name, p in model.named_parameters()}
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, full, model.config.to_dict()


def check_model(model_dir: str) -> dict:
    model, full, hf_config = wrap(model_dir)
    world, rank = dist.get_world_size(), dist.get_rank()
    model_bytes = sum(t.numel() * t.element_size() for t in full.values())
    out: dict = {"model_bytes": model_bytes, "tied": "lm_head.weight" not in full}
    for gen_tp in [t for t in (1, 2, 4) if world % t == 0]:
        plan = FSDPGenerationPlan.for_hf_config(hf_config, world, gen_tp)
        g = plan.gen_tp_rank(rank)
        for naive in (False, True):
            stats = ReshardStats()
            sync = FSDPWeightSync(model, plan, bucket_bytes=256 << 10, naive=naive)
            worst, names, split_layers = 0.0, [], []
            for bucket in sync.buckets(stats):
                in_bucket = {name for name, _ in bucket}
                for name, tensor in bucket:
                    names.append(name)
                    assert tensor.shape == full[name].shape, name
                    got = engine_region(name, tensor, g, gen_tp, hf_config["num_key_value_heads"])
                    expected = engine_region(name, full[name], g, gen_tp, hf_config["num_key_value_heads"])
                    worst = max(worst, (got - expected).abs().max().item())
                    for parts in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
                        if any(f".{p}." in name for p in parts):
                            split_layers += [
                                name
                                for p in parts
                                if name.replace(next(q for q in parts if f".{q}." in name), p)
                                not in in_bucket
                            ]
            totals = torch.tensor([stats.received_bytes, stats.floor_bytes], dtype=torch.float64)
            per_rank = [torch.zeros_like(totals) for _ in range(world)]
            dist.all_gather(per_rank, totals)
            worst_t = torch.tensor([worst])
            dist.all_reduce(worst_t, op=dist.ReduceOp.MAX)
            out[f"tg{gen_tp}{'-naive' if naive else ''}"] = {
                "max_abs_diff": worst_t.item(),
                "names": names,
                "expected_names": sorted(full),
                "split_layers": split_layers,
                "received": [int(r[0]) for r in per_rank],
                "floor": [int(r[1]) for r in per_rank],
                "buckets": stats.buckets,
                "largest_bucket_bytes": stats.largest_bucket_bytes,
                "own_bytes": _own_bytes(full, rank, world),
            }
    return out


def _own_bytes(full: dict[str, torch.Tensor], rank: int, world: int) -> list[int]:
    """Bytes of every parameter's FSDP rows (torch.chunk over the world) held by each rank."""
    own = [0] * world
    for t in full.values():
        for r, rows in enumerate(t.chunk(world, dim=0)):
            own[r] += rows.numel() * rows.element_size()
    return own


def main(argv: list[str]) -> dict:
    return {model_dir.rstrip("/").rsplit("/", 1)[-1]: check_model(model_dir) for model_dir in argv}


def engine(argv: list[str]) -> dict:
    """argv: MODEL_DIR (2 ranks). Perturb the FSDP shards, start a VLLMRollout from the checkpoint at
    rollout.tp=2 (one engine over both ranks), then 1 (one per rank), push the sync's buckets with every
    element outside the rank's engine region set to NaN, and compare the engine's greedy log-probs with
    transformers on the perturbed weights."""
    import time

    from megarl.rollout.vllm import VLLMRollout
    from tests.multiproc.vllm_rollout_checks import config, hf_log_probs, hf_model, max_diff, prompt_batch

    (model_dir,) = argv
    model, _, hf_config = wrap(model_dir)
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(100 + rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local()
            local.add_(0.05 * local.abs().mean() * torch.randn_like(local))
    perturbed = {name: p.detach().full_tensor() for name, p in model.named_parameters()}
    hf = hf_model(model_dir)
    original = hf_model(model_dir)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(perturbed[name])
    out: dict = {}
    # rollout.tp=1 (the `layers` loader) runs through the real hybrid engine in tests/e2e/test_fsdp_runs.py
    for gen_tp in (2,):
        plan = FSDPGenerationPlan.for_hf_config(hf_config, world, gen_tp)
        g = plan.gen_tp_rank(rank)
        start = time.perf_counter()
        rollout = VLLMRollout(config(model_dir, gen_tp), tp_groups=plan.gen_tp_groups)
        started = time.perf_counter() - start
        stats, loaders = ReshardStats(), set()
        for bucket in FSDPWeightSync(model, plan, bucket_bytes=256 << 10).buckets(stats):
            poisoned = []
            for name, tensor in bucket:
                nan = torch.full_like(tensor, float("nan"))
                engine_region(name, nan, g, gen_tp, hf_config["num_key_value_heads"]).copy_(
                    engine_region(name, tensor, g, gen_tp, hf_config["num_key_value_heads"])
                )
                poisoned.append((name, nan))
            loaders.add(rollout.load_weights(poisoned))
        greedy = rollout.generate(prompt_batch(), config(model_dir, gen_tp).rollout.val)
        rollout.close()
        out[f"tg{gen_tp}"] = {
            "engine_start_s": started,
            "loaders": sorted(loaders),
            "ratio": stats.ratio,
            "log_prob_diff": max_diff(greedy["rollout_log_probs"], hf_log_probs(hf, greedy)),
            "original_diff": max_diff(greedy["rollout_log_probs"], hf_log_probs(original, greedy)),
            "responses": greedy["responses"].tolist(),
        }
    return out
