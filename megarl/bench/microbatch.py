"""`megarl bench microbatch`: padded vs packed (token-budget) micro-batches for the policy worker.

Rollout responses have very uneven lengths. Padded micro-batches compute on every pad token up to the
longest sequence in the batch; packed ones put whole sequences back to back in rows of a token budget.
This launches `--nproc` ranks with one policy worker per mode on the same model and the same skewed
batch, and times `log_prob` (forward) and `update` (forward + backward + optimizer step). Writes JSON:
real tokens per second per mode, the fraction of computed positions that were padding, and the
packed/padded speed ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

# what the ranks read from the command line's settings
RANK_SETTINGS = ("tp", "repeats", "rows", "prompt", "response", "micro_batch_size")


def skewed_batch(vocab: int, rows: int, prompt: int, response: int, seed: int = 0):
    """Prompts of 8..prompt tokens; response lengths log-normal (most short, a few hit `response`)."""
    import torch

    from megarl.protocol import Batch
    from megarl.rollout.base import Sample, rollout_batch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(8, prompt + 1, (rows,), generator=g)
    response_lens = (torch.randn(rows, generator=g) * 0.8 + torch.log(torch.tensor(response / 6))).exp()
    response_lens = response_lens.long().clamp(1, response)
    response_lens[0] = response
    prompts = torch.zeros(rows, prompt, dtype=torch.long)
    mask = torch.arange(prompt) >= prompt - prompt_lens[:, None]
    prompts[mask] = torch.randint(1, vocab, (int(mask.sum()),), generator=g)
    samples = [
        [Sample(torch.randint(1, vocab, (int(r),), generator=g).tolist(), [0.0] * int(r), "length")]
        for r in response_lens
    ]
    return rollout_batch(
        Batch(tensors={"prompts": prompts, "attention_mask": mask.long()}), samples, response, 0
    )


def _config(hf: str, tp: int, mode: str, micro_batch_size: int, budget: int, rows: int):
    from megarl.config.schema import MegarlConfig

    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = hf, "fp32"
    cfg.actor.parallel.tp = tp
    cfg.actor.micro_batch_size = micro_batch_size
    cfg.actor.max_tokens_per_micro_batch = budget if mode == "packed" else None
    cfg.actor.optimizer.lr, cfg.actor.optimizer.use_distributed_optimizer = 1e-6, False
    cfg.algorithm.ppo_mini_batch_size = rows  # one optimizer step over the whole batch
    return cfg


def _median_seconds(fn, arg, repeats: int) -> float:
    fn(arg)  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(arg)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def bench_rank(spec: dict) -> dict:
    """The rank program (megarl.distributed.rank_program); `spec` holds the settings `run` passes."""
    import torch

    from megarl.config.roles import role_spec
    from megarl.controller.group import make_worker_group
    from megarl.models.from_hf import ModelArchitecture
    from megarl.protocol import Batch
    from megarl.workers.actor import ActorWorker
    from megarl.workers.sequences import sequences_from_batch

    args = argparse.Namespace(**spec)
    arch = ModelArchitecture.from_pretrained(args.hf)
    batch = skewed_batch(arch.vocab_size, args.rows, args.prompt, args.response)
    lengths = batch["attention_mask"].sum(-1)
    real_tokens = int(lengths.sum())
    budget = max(int(lengths.max()), args.micro_batch_size * int(lengths.float().mean().ceil()))
    result: dict = {"real_tokens": real_tokens, "token_budget": budget}
    for mode in ("padded", "packed"):
        cfg = _config(args.hf, args.tp, mode, args.micro_batch_size, budget, args.rows)
        actor = make_worker_group("spmd", None, ActorWorker, "actor", {"spec": role_spec(cfg, "actor")})
        old = actor.log_prob(batch)["old_log_probs"]
        train = batch.union(Batch(tensors={"old_log_probs": old, "advantages": torch.ones_like(old)}))
        forward = _median_seconds(actor.log_prob, batch, args.repeats)
        update = _median_seconds(actor.update, train, args.repeats)
        # positions computed over all DP ranks: each rank micro-batches its contiguous share
        seqs, dp = sequences_from_batch(batch), actor.worker.layout.dp
        share = args.rows // dp
        per_rank = [
            actor.worker.microbatches(seqs, list(range(r * share, (r + 1) * share))) for r in range(dp)
        ]
        computed = sum(mb["input_ids"].numel() for mbs in per_rank for mb in mbs)
        mbs = per_rank[0]
        result[mode] = {
            "log_prob_seconds": forward,
            "update_seconds": update,
            "log_prob_tokens_per_s": real_tokens / forward,
            "update_tokens_per_s": real_tokens / update,
            "micro_batches_per_rank": len(mbs),
            "padding_fraction": 1 - real_tokens / computed,
        }
    result["packed_over_padded_speed"] = {
        "log_prob": result["padded"]["log_prob_seconds"] / result["packed"]["log_prob_seconds"],
        "update": result["padded"]["update_seconds"] / result["packed"]["update_seconds"],
    }
    return result


def run(args: argparse.Namespace) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    hf = args.hf
    if hf is None:
        from megarl.models.tiny import build_tiny_hf

        hf = str(build_tiny_hf(Path(tempfile.mkdtemp()) / "qwen2", family="qwen2"))
    spec = {name: getattr(args, name) for name in RANK_SETTINGS} | {"hf": hf}
    launch = launch_rank_program("megarl.bench.microbatch:bench_rank", spec, nproc=args.nproc)
    if not launch.results:
        raise RuntimeError(f"microbatch benchmark failed:\n{launch.failure_summary()}")
    result = {
        "what": "policy worker log_prob / update on one skewed batch: padded vs packed micro-batches",
        "model": hf,
        "nproc": args.nproc,
        "tp": args.tp,
        "rows": args.rows,
        "micro_batch_size": args.micro_batch_size,
        **launch.results[0],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hf", default=None, help="HF checkpoint dir (default: a tiny Qwen2 built here)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--rows", type=int, default=32, help="sequences in the batch")
    parser.add_argument("--prompt", type=int, default=32, help="max prompt tokens")
    parser.add_argument("--response", type=int, default=256, help="max response tokens")
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="outputs/bench/microbatch.json")
