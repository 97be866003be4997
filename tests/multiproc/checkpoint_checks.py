"""Rank code for test_checkpoint: the actor's role checkpoint saved and loaded through the worker.

Two rank programs (megarl.distributed.rank_program), argv: HF OTHER_HF DIR MOE_HF (OTHER_HF: another
architecture; MOE_HF: a tiny Qwen3-MoE):
  save_side (4 ranks, TP2×PP2)   same-layout save → load continues bit-exactly (distributed optimizer
                                 on and off), RNG and the actor's counters come back, bad checkpoints
                                 fail with their message; leaves dir/dist_opt_<flag> and the reference
                                 numbers (one more step on batch A, then the loss on batch B)
                                 and the MoE saved at EP2 and TP2×EP2+SP (moe_saved)
  load_side (2 ranks)            loads those checkpoints at TP1×PP2 and TP1×PP1 (DP2) and repeats the
                                 reference's step and loss; the MoE ones at EP1 (moe_resharded)
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from megarl.checkpoint.format import CheckpointError
from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.distributed.layout import ParallelLayout
from megarl.models.forward import run_microbatches, vocab_parallel_log_probs
from megarl.workers.actor import ActorWorker

GLOBAL_BATCH, SEQ, STEPS_BEFORE, STEPS_AFTER = 4, 16, 2, 2


def actor(hf: str, tp: int, pp: int, dist_opt: bool, ep: int = 1) -> ActorWorker:
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = hf, "fp32"
    cfg.actor.parallel.tp, cfg.actor.parallel.pp, cfg.actor.parallel.ep = tp, pp, ep
    cfg.actor.parallel.sequence_parallel = tp > 1 and ep > 1
    o = cfg.actor.optimizer
    o.lr, o.min_lr, o.lr_warmup_steps, o.lr_decay_style, o.clip_grad = 1e-3, 1e-4, 1, "cosine", 0.5
    o.use_distributed_optimizer = dist_opt
    cfg.trainer.total_steps = 8
    return ActorWorker(role_spec(cfg, "actor"))


def batches(vocab: int, n: int, seed: int = 11) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (GLOBAL_BATCH, SEQ + 1), generator=gen) for _ in range(n)]


def step(worker: ActorWorker, tokens: torch.Tensor, update: bool = True) -> float:
    """One optimizer step on `tokens` (each DP rank its share; token mean); the global loss."""
    from megatron.core import parallel_state as ps

    dp, rank = worker.layout.dp, ps.get_data_parallel_rank()
    share = GLOBAL_BATCH // dp
    mine = tokens[rank * share : (rank + 1) * share]
    mbs = [{"input_ids": mine[i : i + 1, :-1], "labels": mine[i : i + 1, 1:]} for i in range(share)]
    vocab = worker.arch.vocab_size

    def token_mean(mb, out):
        loss = -vocab_parallel_log_probs(out, mb["labels"], vocab).mean()
        return loss, {"loss": loss.detach().clone()}

    if update:
        worker.optimizer.zero_grad()
        outs = run_microbatches(worker.chunks, mbs, token_mean, forward_only=False)
        worker.optimizer.step()
    else:
        with torch.no_grad():
            outs = run_microbatches(worker.chunks, mbs, token_mean, forward_only=True)
    collect = ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0
    total = torch.tensor(sum(o["loss"].item() for o in outs) if collect else 0.0, dtype=torch.float64)
    dist.all_reduce(total)
    return total.item() / GLOBAL_BATCH


def snapshot(worker: ActorWorker) -> dict[str, list[torch.Tensor]]:
    inner = [o.optimizer for o in worker.optimizer.optimizer.chained_optimizers]
    state = [s for opt in inner for s in opt.state.values()]
    return {
        "params": [p.detach().clone() for p in worker.chunks[0].module.parameters()],
        "moments": [s[k].clone() for s in state for k in ("exp_avg", "exp_avg_sq")],
        "steps": [s["step"].clone() for s in state],
        "step_ptrs": [s["step"].data_ptr() for s in state],
    }


def rng_draws() -> list[float]:
    return [random.random(), float(np.random.rand()), torch.rand(1).item()]


def all_ranks(flag: bool) -> bool:
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def error_of(fn) -> str:
    try:
        fn()
    except CheckpointError as e:
        return str(e)
    return ""


def same_layout(spec: dict, dist_opt: bool) -> dict:
    hf, root = spec["hf"], Path(spec["dir"])
    ckpt = root / f"dist_opt_{dist_opt}"
    a = actor(hf, 2, 2, dist_opt)
    data = batches(a.arch.vocab_size, STEPS_BEFORE + STEPS_AFTER + 2)
    for tokens in data[:STEPS_BEFORE]:
        step(a, tokens)
    a._load_extra_state({"sampling_step": 7})
    torch.rand(3, generator=a._loss_generator())  # advance it: the saved state is not the fresh one
    saved = a.save_checkpoint(str(ckpt), {"step": STEPS_BEFORE})
    rng_at_save = {"torch": torch.get_rng_state().clone(), "generator": a._generator.get_state()}
    draws_a = rng_draws()
    losses_a = [step(a, t) for t in data[STEPS_BEFORE : STEPS_BEFORE + STEPS_AFTER]]
    after_a = snapshot(a)
    ParallelLayout.destroy()

    torch.manual_seed(999)
    random.seed(999)
    b = actor(hf, 2, 2, dist_opt)
    step(b, data[-1])  # b has trained differently: the load must overwrite everything
    report = b.load_checkpoint(str(ckpt))
    rng_restored = torch.equal(torch.get_rng_state(), rng_at_save["torch"])
    generator_restored = torch.equal(b._generator.get_state(), rng_at_save["generator"])
    draws_b = rng_draws()
    losses_b = [step(b, t) for t in data[STEPS_BEFORE : STEPS_BEFORE + STEPS_AFTER]]
    after_b = snapshot(b)
    equal = {
        k: len(after_a[k]) == len(after_b[k])
        and all(torch.equal(x, y) for x, y in zip(after_a[k], after_b[k]))
        for k in ("params", "moments", "steps")
    }
    # The reference of the layout change: the checkpoint again (into a trained worker), one more step
    # on batch A, the loss on batch B.
    b.load_checkpoint(str(ckpt))
    ref_step = step(b, data[-2])
    ref_loss = step(b, data[-1], update=False)
    ParallelLayout.destroy()
    files = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    return {
        "saved": saved,
        "report": {k: v for k, v in report.items() if k != "seconds"},
        "losses_a": losses_a,
        "losses_b": losses_b,
        "equal": equal,
        "steps_distinct": len(set(after_b["step_ptrs"])) == len(after_b["step_ptrs"]),
        "step_values": sorted({s.item() for s in after_b["steps"]}),
        "num_updates": b.optimizer.num_updates,
        "rng_restored": all_ranks(rng_restored),
        "generator_restored": all_ranks(generator_restored),
        "draws_equal": all_ranks(draws_a == draws_b),
        "sampling_step": b._sampling_step,
        "ref_step_loss": ref_step,
        "ref_loss": ref_loss,
        "files": files,
        "meta": json.loads((ckpt / "megarl_checkpoint.json").read_text()),
    }


def bad_checkpoints(spec: dict) -> dict:
    """Damaged copies of the dist_opt_True checkpoint, and a checkpoint of another architecture."""
    root = Path(spec["dir"])
    good = root / "dist_opt_True"
    cases = {}
    if dist.get_rank() == 0:
        for name in ("truncated", "corrupt", "no_manifest", "bad_json"):
            shutil.copytree(good, root / name)
        shard = next(p for p in sorted((root / "truncated" / "optimizer").glob("*.distcp")))
        shard.write_bytes(shard.read_bytes()[:-100])
        shard = next(p for p in sorted((root / "corrupt" / "model").glob("*.distcp")))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        (root / "no_manifest" / "manifest.json").unlink()
        (root / "bad_json" / "megarl_checkpoint.json").write_text("{not json")
        (root / "never.partial").mkdir()
    dist.barrier()
    w = actor(spec["hf"], 2, 2, True)
    before = [p.detach().clone() for p in w.chunks[0].module.parameters()]
    for name in ("truncated", "corrupt", "no_manifest", "bad_json", "never", "missing"):
        cases[name] = error_of(lambda n=name: w.load_checkpoint(str(root / n)))
    unchanged = all(torch.equal(p, q) for p, q in zip(before, w.chunks[0].module.parameters()))
    ParallelLayout.destroy()
    other = actor(spec["other_hf"], 2, 2, True)
    cases["other_architecture"] = error_of(lambda: other.load_checkpoint(str(good)))
    ParallelLayout.destroy()
    ref = actor(spec["hf"], 2, 2, True)
    ref.optimizer = None
    frozen = ""
    try:
        ref.save_checkpoint(str(root / "frozen"))
    except ValueError as e:
        frozen = str(e)
    ParallelLayout.destroy()
    return {"errors": cases, "frozen": frozen, "params_unchanged_by_failed_loads": unchanged}


# MoE: (tp, ep) at which the tiny Qwen3-MoE is saved (4 ranks), per distributed-optimizer flag
MOE_SAVED = {False: (1, 2), True: (2, 2)}


def moe_saved(spec: dict) -> list[dict]:
    """The tiny Qwen3-MoE saved at EP2 (and TP2×EP2+SP with the distributed optimizer) after two steps; the
    uninterrupted run's next step (batch A) and loss (batch B), and the same after loading the
    checkpoint back into the same worker (the same layout: bit-exact)."""
    results = []
    for dist_opt, (tp, ep) in MOE_SAVED.items():
        ckpt = Path(spec["dir"]) / f"moe_dist_opt_{dist_opt}"
        a = actor(spec["moe_hf"], tp, 1, dist_opt, ep=ep)
        data = batches(a.arch.vocab_size, STEPS_BEFORE + 2)
        for tokens in data[:STEPS_BEFORE]:
            step(a, tokens)
        a.save_checkpoint(str(ckpt), {"step": STEPS_BEFORE})
        ref = [step(a, data[-2]), step(a, data[-1], update=False)]
        report = a.load_checkpoint(str(ckpt))
        again = [step(a, data[-2]), step(a, data[-1], update=False)]
        ParallelLayout.destroy()
        meta = json.loads((ckpt / "megarl_checkpoint.json").read_text())
        results.append(
            {
                "check": f"moe_dist_opt_{dist_opt}",
                "saved_layout": meta["saved_layout"],
                "optimizer": report["optimizer"],
                "ref": ref,
                "same_layout": again,
            }
        )
    return results


def moe_resharded(spec: dict) -> list[dict]:
    """moe_saved's checkpoints loaded at EP1 (TP1, DP2): the uninterrupted run's next step and loss."""
    results = []
    for dist_opt in MOE_SAVED:
        w = actor(spec["moe_hf"], 1, 1, dist_opt)
        data = batches(w.arch.vocab_size, STEPS_BEFORE + 2)
        report = w.load_checkpoint(str(Path(spec["dir"]) / f"moe_dist_opt_{dist_opt}"))
        results.append(
            {
                "check": f"moe_ep1_dist_opt_{dist_opt}",
                "optimizer": report["optimizer"],
                "num_updates": w.optimizer.num_updates,
                "resumed": [step(w, data[-2]), step(w, data[-1], update=False)],
            }
        )
        ParallelLayout.destroy()
    return results


def _spec(argv: list[str]) -> dict:
    return dict(zip(("hf", "other_hf", "dir", "moe_hf"), argv))


def save_side(argv: list[str]) -> list[dict]:
    spec = _spec(argv)
    results = [{"check": f"same_layout_dist_opt_{flag}", **same_layout(spec, flag)} for flag in (False, True)]
    return [*results, {"check": "bad_checkpoints", **bad_checkpoints(spec)}, *moe_saved(spec)]


def load_side(argv: list[str]) -> list[dict]:
    spec = _spec(argv)
    hf, root = spec["hf"], Path(spec["dir"])
    results = []
    for tp, pp in ((1, 2), (1, 1)):
        for dist_opt in (False, True):
            w = actor(hf, tp, pp, dist_opt)
            data = batches(w.arch.vocab_size, STEPS_BEFORE + STEPS_AFTER + 2)
            report = w.load_checkpoint(str(root / f"dist_opt_{dist_opt}"))
            results.append(
                {
                    "check": f"tp{tp}pp{pp}_dist_opt_{dist_opt}",
                    "report": {k: v for k, v in report.items() if k != "seconds"},
                    "num_updates": w.optimizer.num_updates,
                    "step_loss": step(w, data[-2]),
                    "loss": step(w, data[-1], update=False),
                    "sampling_step": w._sampling_step,
                    "generator": w._generator is not None,
                }
            )
            ParallelLayout.destroy()
    return [*results, *moe_resharded(spec)]
