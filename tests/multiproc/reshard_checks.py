"""Rank code for test_reshard: training shards -> generation-TP shards of HF tensors, on 4 ranks.

argv: POLICY_HF MOE_HF. For each (t, p) -> t_g of issue 5 (and each (t, p, ep) -> t_g of a Qwen3-MoE), every rank reshards its freshly loaded model and
checks each HF tensor's engine region (what vLLM's loader narrows for generation TP rank g) against the
HF checkpoint, bit for bit; and counts bytes received against the plan's floor, zero-redundancy vs naive.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.distributed.generation_plan import GenerationPlan
from megarl.hybrid.reshard import Resharder, ReshardStats
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.workers.reference import ReferenceWorker

CASES = {(2, 2): (1, 2), (2, 1): (1, 2), (1, 2): (1,), (4, 1): (2,)}
# a mixture-of-experts model with expert parallelism: (tp, pp, ep) -> generation TPs (experts TP-sharded)
MOE_CASES = {(1, 1, 2): (1,), (2, 1, 2): (1, 2), (1, 2, 2): (1,), (1, 1, 4): (1,)}


def engine_region(name: str, full: torch.Tensor, g: int, t_g: int, padded_vocab: int) -> torch.Tensor:
    """The part of HF tensor `name` that generation TP rank g of t_g loads (vLLM's sharding)."""
    if "norm" in name or name.endswith(("mlp.gate.weight", "shared_expert_gate.weight")):
        return full  # replicated (norms, an MoE router, a shared expert's gate)
    if "embed_tokens" in name or "lm_head" in name:
        rows = padded_vocab // t_g
        return full[g * rows : min((g + 1) * rows, full.shape[0])]
    if "o_proj" in name or "down_proj" in name:
        return full.chunk(t_g, dim=1)[g]
    return full.chunk(t_g, dim=0)[g]  # q/k/v (weights, biases), gate, up


def check(hf_dir: str, tp: int, pp: int, gen_tps: tuple[int, ...], ep: int = 1) -> dict:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = hf_dir, "fp32"
    cfg.actor.parallel.tp, cfg.actor.parallel.pp, cfg.actor.parallel.ep = tp, pp, ep
    cfg.actor.parallel.sequence_parallel = ep > 1 and tp > 1  # megatron's rule for experts under TP
    worker = ReferenceWorker(role_spec(cfg, "ref"))  # the weights, no optimizer
    reader = HFCheckpointReader(hf_dir)
    padded_vocab = _padded_vocab(worker)
    out = {}
    for t_g in gen_tps:
        plan = GenerationPlan.for_layout(worker.layout, t_g, worker.arch.num_kv_heads)
        g = plan.gen_tp_rank(dist.get_rank())
        for naive in (False, True):
            stats = ReshardStats()
            resharder = Resharder(worker.chunks, worker.arch, plan, bucket_bytes=256 << 10, naive=naive)
            worst, names = 0.0, set()
            for bucket in resharder.buckets(stats):
                for name, tensor in bucket:
                    names.add(name)
                    expected = engine_region(name, reader.get(name), g, t_g, padded_vocab)
                    got = engine_region(name, tensor, g, t_g, padded_vocab)
                    worst = max(worst, (got - expected).abs().max().item())
            missing = sorted(set(reader.names()) - names - {"lm_head.weight"})
            totals = torch.tensor([stats.received_bytes, stats.floor_bytes], dtype=torch.float64)
            per_rank = [torch.zeros_like(totals) for _ in range(dist.get_world_size())]
            dist.all_gather(per_rank, totals)
            out[f"t{tp}p{pp}{f'e{ep}' if ep > 1 else ''}->tg{t_g}{'-naive' if naive else ''}"] = {
                "max_abs_diff": _world_max(worst),
                "missing": missing,
                "received": [int(r[0]) for r in per_rank],
                "floor": [int(r[1]) for r in per_rank],
                "ratio": [
                    float(r[0] / r[1]) if r[1] else (1.0 if r[0] == 0 else float("inf")) for r in per_rank
                ],
                "buckets": stats.buckets,
                "largest_bucket_bytes": stats.largest_bucket_bytes,
                "seconds": stats.seconds,
            }
    return out


def _padded_vocab(worker: ReferenceWorker) -> int:
    from megarl.config.schema import padded_vocab_size

    return padded_vocab_size(
        worker.arch.vocab_size, worker.spec.model.make_vocab_size_divisible_by, worker.layout.tp
    )


def _world_max(value: float) -> float:
    t = torch.tensor([value])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def main(argv: list[str]) -> dict:
    hf_dir, moe_dir = argv
    results = {}
    for (tp, pp), gen_tps in CASES.items():
        results.update(check(hf_dir, tp, pp, gen_tps))
    for (tp, pp, ep), gen_tps in MOE_CASES.items():
        results.update(check(moe_dir, tp, pp, gen_tps, ep))
    return results
