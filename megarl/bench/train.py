"""`megarl bench train`: the policy update's forward+backward (+ optimizer step) in Megatron vs plain
transformers + torch eager, same model, batch and loss, one process, same threads: fp32 on the CPU by
default; on a GPU also bf16 (`--dtype`) and the MFU of both (model FLOPs, `update_flops`, over the
GPU's dense peak).

megarl: an ActorWorker (TP1, DP1) running `update` on a batch of random prompts + responses with
advantages (PPO clip loss at ratio 1, token-mean, the fused old log-probs). transformers: the same HF
checkpoint (SDPA attention), log-softmax of the response positions, the same loss, backward, AdamW.
Both: `--warmup` updates, then the median (min–max) of `--repeats`. The CPU shims' share is measured
in the same process: the number of torch calls the cuda_literal mode intercepts during one update,
times its per-call cost (timed on a small op with and without the mode). Each side's peak memory is
measured in the same process, one side after another (megarl.bench.memory: CUDA's peak allocation,
or on CPU the resident set's high-water mark reset per side). `--backend fsdp` adds megarl's FSDP actor
on the same batch (megarl.bench.train_fsdp). Writes `<out>/train.json` and `train.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Literal

from megarl.bench import train_fsdp
from megarl.bench.e2e import SIZES, prepare
from megarl.bench.measure import spread, spread_text
from megarl.bench.memory import PeakMemory


def _batch(vocab: int, n: int, prompt: int, response: int, seed: int = 0):
    """Full-length random prompts and responses, advantages ±1 per sequence."""
    import torch

    from megarl.protocol import Batch

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(5, vocab, (n, prompt), generator=g)
    responses = torch.randint(5, vocab, (n, response), generator=g)
    advantages = torch.where(torch.rand(n, 1, generator=g) < 0.5, -1.0, 1.0).expand(n, response).contiguous()
    return Batch(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": torch.ones(n, prompt + response, dtype=torch.long),
            "response_mask": torch.ones(n, response),
            "rollout_log_probs": torch.zeros(n, response),
            "advantages": advantages,
        }
    )


def _timed(fn, warmup: int, repeats: int) -> dict:
    """{"seconds": per timed call, "page_faults": minor page faults of this process per timed call}."""
    import resource

    from megarl.distributed.platform import platform

    for _ in range(warmup):
        fn()
    seconds = []
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(repeats):
        platform().synchronize()
        start = time.perf_counter()
        fn()
        platform().synchronize()
        seconds.append(time.perf_counter() - start)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"seconds": seconds, "page_faults": faults // repeats}


# dense peak FLOP/s per GPU by name (the vendors' data sheets, no sparsity), for MFU
PEAK_FLOPS = {"H200": {"bf16": 989e12, "fp32": 67e12}, "H100": {"bf16": 989e12, "fp32": 67e12}}


def update_flops(hf_config, sequences: int, seq_len: int) -> float:
    """Model FLOPs of one forward+backward over `sequences` × `seq_len` tokens: 6 × the matmul
    parameters (attention and MLP projections, the LM head; not the embedding lookup) per token, plus
    the attention scores and values, 12 × layers × hidden × seq_len per token (PaLM's accounting)."""
    c = hf_config
    h, layers = c.hidden_size, c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or h // c.num_attention_heads
    attention = h * c.num_attention_heads * head_dim * 2 + h * c.num_key_value_heads * head_dim * 2
    matmul_params = layers * (attention + 3 * h * c.intermediate_size) + h * c.vocab_size
    return sequences * seq_len * (6 * matmul_params + 12 * layers * h * seq_len)


def peak_flops(dtype: str) -> float | None:
    """This GPU's dense peak for `dtype`, None on CPU or an unlisted GPU (no MFU then)."""
    from megarl.distributed.platform import platform

    if not platform().is_cuda:
        return None
    import torch

    name = torch.cuda.get_device_name()
    return next((peaks[dtype] for key, peaks in PEAK_FLOPS.items() if key in name), None)


def actor_config(args, backend: Literal["megatron", "fsdp"]):
    """The actor's config for this bench: one mini-batch of all sequences, the fused old log-probs."""
    from megarl.config.schema import MegarlConfig

    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = args.model, args.dtype
    cfg.rollout.n, cfg.data.train_batch_size = 1, args.sequences
    cfg.algorithm.ppo_mini_batch_size = args.sequences
    cfg.algorithm.old_log_prob = "fused"
    cfg.actor.backend = backend
    cfg.actor.micro_batch_size = args.micro_batch or args.sequences
    cfg.actor.optimizer.weight_decay, cfg.actor.optimizer.clip_grad = 0.0, 1.0
    return cfg


def time_actor(actor_cls, cfg, args, batch, memory: PeakMemory) -> tuple:
    """(the actor, {"seconds", "page_faults", "first_update": the metrics of its first update}), its
    build and updates measured by `memory` (started by the caller before anything of it is built)."""
    from megarl.config.roles import role_spec

    actor = actor_cls(role_spec(cfg, "actor"))
    memory.built()
    updates: list[dict] = []
    timed = _timed(lambda: updates.append(actor.update(batch)), args.warmup, args.repeats)
    memory.stop()
    return actor, {**timed, "first_update": updates[0], "memory": memory.result}


def _megatron(args, batch) -> dict:
    from megarl.models.openblas_linear import gemm_of
    from megarl.workers.actor import ActorWorker

    memory = PeakMemory()
    memory.start()
    actor, timed = time_actor(ActorWorker, actor_config(args, "megatron"), args, batch, memory)
    calls = _count_mode_calls(lambda: actor.update(batch))
    return {**timed, "intercepted_calls": calls, "gemm": gemm_of(actor.chunks)}


def _count_mode_calls(fn) -> int:
    """Torch calls the cuda_literal mode sees during fn(): a counting mode pushed right above it."""
    from torch.overrides import TorchFunctionMode

    count = 0

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            nonlocal count
            count += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn()
    return count


def _mode_cost_per_call(n: int = 20000) -> float:
    """Seconds the cuda_literal mode adds to one small torch call (x + x on 8×8), in this process."""
    import torch

    from megarl.distributed import cpu_shims

    x = torch.randn(8, 8)

    def loop() -> float:
        start = time.perf_counter()
        for _ in range(n):
            x.add(x)
        return (time.perf_counter() - start) / n

    with_mode = min(loop() for _ in range(3))
    with cpu_shims.cuda_literal_suspended():
        without = min(loop() for _ in range(3))
    return max(with_mode - without, 0.0)


def _transformers(args, batch) -> dict:
    import contextlib

    import torch
    from transformers import AutoModelForCausalLM

    from megarl.distributed.cpu_shims import cuda_literal_suspended
    from megarl.distributed.platform import platform

    device = platform().device
    memory = PeakMemory()
    memory.start()
    # bf16: fp32 weights and optimizer under autocast, as Megatron's bf16 params + fp32 main params
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if args.dtype == "bf16"
        else contextlib.nullcontext()
    )
    with cuda_literal_suspended():  # plain torch eager: none of megarl's CPU shims
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
        ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        responses, adv = batch["responses"].to(device), batch["advantages"].to(device)
        start = ids.shape[1] - responses.shape[1]

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with autocast:
                logits = model(input_ids=ids, attention_mask=mask).logits[:, start - 1 : -1].float()
            lp = torch.log_softmax(logits, dim=-1).gather(-1, responses[..., None])[..., 0]
            ratio = torch.exp(lp - lp.detach())
            loss = -(torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        memory.built()
        timed = _timed(step, args.warmup, args.repeats)
        memory.stop()
        return {**timed, "memory": memory.result}


def bench_rank(spec: dict) -> dict:
    """The rank program (one rank): both sides in this process, torch at `threads` threads."""
    import torch
    from transformers import AutoConfig

    args = argparse.Namespace(**spec)
    torch.set_num_threads(args.threads)
    hf_config = AutoConfig.from_pretrained(args.model)
    batch = _batch(hf_config.vocab_size, args.sequences, args.prompt_len, args.response_len)
    megatron = _megatron(args, batch)
    hf = _transformers(args, batch)
    fsdp = train_fsdp.fsdp_side(args, batch) if args.backend == "fsdp" else None
    per_call = _mode_cost_per_call()
    tokens = args.sequences * (args.prompt_len + args.response_len)
    m, h = spread(megatron["seconds"]), spread(hf["seconds"])
    shim_seconds = megatron["intercepted_calls"] * per_call
    flops = update_flops(hf_config, args.sequences, args.prompt_len + args.response_len)
    peak = peak_flops(args.dtype)
    result = {
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "gemm": megatron["gemm"],  # Megatron's linear layers (transformers always multiplies with torch's)
        "tokens": tokens,
        "model_flops": flops,
        "mfu": None
        if peak is None
        else {"megatron": flops / m["median"] / peak, "transformers": flops / h["median"] / peak},
        "megatron": {**m, "tokens_per_s": tokens / m["median"], "raw": megatron["seconds"]},
        "transformers": {**h, "tokens_per_s": tokens / h["median"], "raw": hf["seconds"]},
        "page_faults": {"megatron": megatron["page_faults"], "transformers": hf["page_faults"]},
        "ratio_tokens_per_s": h["median"] / m["median"],
        "shim": {
            "intercepted_calls": megatron["intercepted_calls"],
            "seconds_per_call": per_call,
            "seconds": shim_seconds,
            "share_of_update": shim_seconds / m["median"],
        },
        "memory": {"megatron": megatron["memory"], "transformers": hf["memory"]},
    }
    if fsdp is not None:
        result["fsdp"] = train_fsdp.summary(fsdp, megatron, tokens)
        result["memory"]["fsdp"] = fsdp["memory"]
    return result


def run(args: argparse.Namespace) -> dict:
    from megarl.distributed.rank_program import launch_rank_program

    root = Path(args.out)
    result: dict = {"sizes": {}}
    for name in args.sizes:
        model, _, params = prepare(SIZES[name], root)
        spec = {
            "model": str(model),
            "sequences": args.sequences,
            "prompt_len": args.prompt_len,
            "response_len": args.response_len,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "threads": args.threads or os.cpu_count(),
            "micro_batch": args.micro_batch,
            "dtype": args.dtype,
            "backend": args.backend,
        }
        print(
            f"bench train {name}: {params / 1e6:.2f}M, {args.sequences}×({args.prompt_len}+{args.response_len})"
        )
        launch = launch_rank_program("megarl.bench.train:bench_rank", spec, nproc=1)
        if not launch.results:
            raise RuntimeError(f"train benchmark failed:\n{launch.failure_summary()}")
        result["sizes"][name] = {"params": params, **spec, **launch.results[0]}
        (root / "train.json").write_text(json.dumps(result, indent=2))
        (root / "train.md").write_text(table(result))
    return result


def table(result: dict) -> str:
    lines = [
        "# megarl bench train — policy update (fwd+bwd+optimizer), one process, median (min–max)",
        "",
        "| size | device, dtype | tokens | threads | Megatron s | transformers s | Megatron tok/s | transformers tok/s "
        "| Megatron/transformers | MFU Megatron / transformers | page faults per update Megatron / transformers "
        "| shim calls | shim s (share) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in result["sizes"].items():
        m, h, s = r["megatron"], r["transformers"], r["shim"]
        mfu = r.get("mfu")
        mfu_text = "–" if mfu is None else f"{mfu['megatron']:.1%} / {mfu['transformers']:.1%}"
        faults = r.get("page_faults")
        faults_text = "–" if faults is None else f"{faults['megatron']:,} / {faults['transformers']:,}"
        lines.append(
            f"| {name} ({r['params'] / 1e6:.2f}M) | {r.get('device', 'cpu')}, {r.get('dtype', 'fp32')}, "
            f"Megatron's GEMM: {r.get('gemm', 'torch')} "
            f"| {r['tokens']} | {r['threads']} "
            f"| {spread_text(m, '{:.3f}')} | {spread_text(h, '{:.3f}')} "
            f"| {m['tokens_per_s']:.0f} | {h['tokens_per_s']:.0f} | **{r['ratio_tokens_per_s']:.2f}×** | {mfu_text} | {faults_text} "
            f"| {s['intercepted_calls']} | {s['seconds']:.3f} ({s['share_of_update']:.0%}) |"
        )
    return "\n".join(lines) + "\n" + train_fsdp.table(result)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "3m", "25m"], choices=list(SIZES))
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--response-len", type=int, default=96)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=["fp32", "bf16"],
        help="bf16: Megatron bf16 params, transformers autocast",
    )
    parser.add_argument(
        "--micro-batch", type=int, default=None, help="Megatron's micro-batch (default: all sequences, as HF)"
    )
    parser.add_argument(
        "--backend",
        default="megatron",
        choices=["megatron", "fsdp"],
        help="fsdp: also time megarl's FSDP actor on the same batch, beside Megatron and transformers, "
        "with each side's peak memory (a second table)",
    )
