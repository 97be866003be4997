"""Rank code for test_reshard: training shards -> generation-TP shards of HF tensors, on 4 ranks.

argv: POLICY_HF MOE_HF. For each (t, p) -> t_g of issue 5 (and each (t, p, ep) -> t_g of a Qwen3-MoE, with the
engine's experts TP-sharded or, gen_ep, whole in blocks), every rank reshards its freshly loaded model and
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
# ... into an engine with expert parallelism (gen_ep: whole experts, a block per generation TP rank)
GEN_EP_CASES = {(2, 1, 2): (2,), (2, 2, 1): (2,)}


def routed_expert(name: str) -> int | None:
    """The global expert index of a routed expert's HF tensor (`...mlp.experts.{e}....`), else None."""
    head, _, tail = name.partition(".mlp.experts.")
    return int(tail.split(".")[0]) if head and tail else None


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


def check(
    hf_dir: str, tp: int, pp: int, gen_tps: tuple[int, ...], ep: int = 1, ep_gen_tps: tuple[int, ...] = ()
) -> dict:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = hf_dir, "fp32"
    cfg.actor.parallel.tp, cfg.actor.parallel.pp, cfg.actor.parallel.ep = tp, pp, ep
    cfg.actor.parallel.sequence_parallel = ep > 1 and tp > 1  # megatron's rule for experts under TP
    worker = ReferenceWorker(role_spec(cfg, "ref"))  # the weights, no optimizer
    reader = HFCheckpointReader(hf_dir)
    padded_vocab = _padded_vocab(worker)
    out = {}
    for t_g, gen_ep in [(t, False) for t in gen_tps] + [(t, True) for t in ep_gen_tps]:
        plan = GenerationPlan.for_layout(worker.layout, t_g, worker.arch.num_kv_heads, gen_ep=gen_ep)
        g = plan.gen_tp_rank(dist.get_rank())
        # gen_ep: this rank's engine holds its block of experts whole, and no other expert
        block = plan.engine_experts(dist.get_rank(), worker.arch.num_experts) if gen_ep else None
        for naive in (False,) if gen_ep else (False, True):
            stats = ReshardStats()
            resharder = Resharder(worker.chunks, worker.arch, plan, bucket_bytes=256 << 10, naive=naive)
            worst, names = 0.0, set()
            for bucket in resharder.buckets(stats):
                for name, tensor in bucket:
                    names.add(name)
                    if block is not None and routed_expert(name) is not None:
                        assert routed_expert(name) in block, f"{name} sent outside the engine's block"
                        expected, got = reader.get(name), tensor
                    else:
                        expected = engine_region(name, reader.get(name), g, t_g, padded_vocab)
                        got = engine_region(name, tensor, g, t_g, padded_vocab)
                    worst = max(worst, (got - expected).abs().max().item())
            others = {
                n for n in reader.names() if block is not None and routed_expert(n) not in (None, *block)
            }
            missing = sorted(set(reader.names()) - names - others - {"lm_head.weight"})
            totals = torch.tensor([stats.received_bytes, stats.floor_bytes], dtype=torch.float64)
            per_rank = [torch.zeros_like(totals) for _ in range(dist.get_world_size())]
            dist.all_gather(per_rank, totals)
            experts = f"e{ep}" if ep > 1 or ep_gen_tps else ""
            out[f"t{tp}p{pp}{experts}->tg{t_g}{'ep' if gen_ep else ''}{'-naive' if naive else ''}"] = {
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
    for tp, pp, ep in {**MOE_CASES, **GEN_EP_CASES}:
        results.update(
            check(moe_dir, tp, pp, MOE_CASES.get((tp, pp, ep), ()), ep, GEN_EP_CASES.get((tp, pp, ep), ()))
        )
    return results
