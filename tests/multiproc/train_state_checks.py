"""Rank code for test_train_state: megatron's optimizer at DP2, and offloading the training state.

A rank program (megarl.distributed.rank_program) on 2 ranks (TP1 PP1 DP2), argv: DIR [CHECK ...].
DIR is where the disk target writes; CHECKs (names without check_) pick a subset. It reports one
result per check: {"check": name, "seconds": ..., ...numbers}. The independent reference for the
optimizer is torch.optim.AdamW on an unwrapped copy of the model over the whole global batch, with
the learning rate computed by hand.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from megarl.config.schema import OptimizerConfig
from megarl.distributed.layout import ParallelLayout
from megarl.hybrid.offload import (
    DiskFiles,
    HostMemory,
    offload_grads,
    offload_optimizer,
    offload_params,
    reload_grads,
    reload_optimizer,
    reload_params,
)
from megarl.models.build import build_model_chunks
from megarl.models.ddp import wrap_ddp
from megarl.models.forward import run_microbatches, vocab_parallel_log_probs
from megarl.models.from_hf import ModelArchitecture
from megarl.models.optimizer import build_optimizer


def _arch(hidden: int, layers: int, ffn: int, vocab: int, heads: int) -> ModelArchitecture:
    return ModelArchitecture.from_hf_config(
        {
            "model_type": "llama",
            "num_hidden_layers": layers,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": heads // 2,
            "intermediate_size": ffn,
            "vocab_size": vocab,
        }
    )


SMALL = _arch(hidden=64, layers=2, ffn=128, vocab=300, heads=2)
# ~13M parameters: 51 MB of fp32 weights, large enough for RSS to show what offloading frees.
LARGE = _arch(hidden=384, layers=4, ffn=1024, vocab=8192, heads=6)
LAYOUT = ParallelLayout(world_size=2)
GLOBAL_BATCH, SEQ = 4, 16
CLIP = 0.5
SCHEDULE = dict(lr=1e-3, min_lr=1e-4, lr_warmup_steps=2, lr_decay_style="cosine")
STEPS = 5


def batches(arch: ModelArchitecture, n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, arch.vocab_size, (GLOBAL_BATCH, SEQ + 1), generator=gen) for _ in range(n)]


def initial_weights(arch: ModelArchitecture) -> dict[str, torch.Tensor]:
    LAYOUT.initialize(seed=5)
    return {name: p.detach().clone() for name, p in build_model_chunks(arch, LAYOUT)[0].named_parameters()}


def model(arch: ModelArchitecture, weights: dict, dtype: str = "fp32", dist_opt: bool | None = None):
    """A fresh model with `weights`; DDP-wrapped when dist_opt is not None."""
    chunk = build_model_chunks(arch, LAYOUT, dtype)[0]
    with torch.no_grad():
        for name, p in chunk.named_parameters():
            p.copy_(weights[name])
    return [chunk] if dist_opt is None else wrap_ddp([chunk], use_distributed_optimizer=dist_opt)


def train_step(
    chunks, opt, tokens: torch.Tensor, arch: ModelArchitecture, step: bool = True, nan_on_rank: int = -1
) -> tuple[float, dict]:
    """One optimizer step on this rank's half of `tokens` (only the gradients with step=False); the loss
    is the token mean of the global batch (NaN on rank `nan_on_rank`)."""
    rank, half = dist.get_rank(), GLOBAL_BATCH // 2
    mine = tokens[rank * half : (rank + 1) * half]
    microbatches = [{"input_ids": mine[i : i + 1, :-1], "labels": mine[i : i + 1, 1:]} for i in range(half)]

    def token_mean(mb, out):
        loss = -vocab_parallel_log_probs(out, mb["labels"], arch.vocab_size).mean()
        if dist.get_rank() == nan_on_rank:
            loss = loss * float("nan")
        return loss, {"loss": loss.detach().clone()}

    opt.zero_grad()
    outs = run_microbatches(chunks, microbatches, token_mean, forward_only=False)
    loss = torch.tensor(sum(o["loss"].item() for o in outs) / GLOBAL_BATCH, dtype=torch.float64)
    dist.all_reduce(loss)
    return loss.item(), opt.step() if step else {}


def full_params(chunks) -> dict[str, torch.Tensor]:
    return {name: p.detach().float().clone() for name, p in chunks[0].module.named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def scheduled_lr(step: int, lr: float, min_lr: float, warmup: int, total: int, style: str) -> float:
    import math

    if warmup and step <= warmup:
        return lr * step / warmup
    if style == "constant":
        return lr
    ratio = min((step - warmup) / (total - warmup), 1.0)
    coeff = 1 - ratio if style == "linear" else 0.5 * (1 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


def reference(arch: ModelArchitecture, weights: dict, data: list[torch.Tensor]) -> dict:
    """torch AdamW on an unwrapped model over the whole batch: no wd on biases/norms, clip by hand."""
    chunk = model(arch, weights)[0]
    cfg = OptimizerConfig(**SCHEDULE, clip_grad=CLIP)
    decay = [p for n, p in chunk.named_parameters() if p.ndim > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in chunk.named_parameters() if not (p.ndim > 1 and not n.endswith(".bias"))]
    torch_opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        betas=tuple(cfg.betas),
        eps=cfg.eps,
    )
    norms, losses = [], []
    for step, tokens in enumerate(data):
        for group in torch_opt.param_groups:
            group["lr"] = scheduled_lr(step, cfg.lr, cfg.min_lr, cfg.lr_warmup_steps, STEPS, "cosine")
        torch_opt.zero_grad()
        inputs = tokens[:, :-1]
        logits = chunk(
            input_ids=inputs, position_ids=torch.arange(SEQ).expand_as(inputs), attention_mask=None
        )
        loss = torch.nn.functional.cross_entropy(
            logits[..., : arch.vocab_size].flatten(0, 1), tokens[:, 1:].flatten()
        )
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(chunk.parameters(), CLIP).item())
        losses.append(loss.item())
        torch_opt.step()
    return {
        "params": {n: p.detach().clone() for n, p in chunk.named_parameters()},
        "norms": norms,
        "losses": losses,
    }


def run_training(arch, weights, data, dist_opt: bool, dtype: str = "fp32") -> dict:
    chunks = model(arch, weights, dtype, dist_opt)
    cfg = OptimizerConfig(**SCHEDULE, clip_grad=CLIP, use_distributed_optimizer=dist_opt)
    opt = build_optimizer(chunks, cfg, total_steps=STEPS)
    out = {"losses": [], "steps": [], "clipped_norms": []}
    for tokens in data:
        loss, step = train_step(chunks, opt, tokens, arch)
        out["losses"].append(loss)
        out["steps"].append(step)
        # The optimizer's main gradients after step() are the clipped ones.
        out["clipped_norms"].append(float(opt.optimizer.get_grad_norm()))
    out.update(params=full_params(chunks), chunks=chunks, opt=opt)
    return out


# --- optimizer ------------------------------------------------------------------------------------


def check_adam_matches_reference_with_and_without_distributed_optimizer():
    weights = initial_weights(SMALL)
    data = batches(SMALL, STEPS)
    ref = reference(SMALL, weights, data)
    runs = {flag: run_training(SMALL, weights, data, dist_opt=flag) for flag in (False, True)}
    off, on = runs[False], runs[True]
    return {
        "dist_opt_vs_plain_max_param_diff": max_diff(on["params"], off["params"]),
        "plain_vs_reference_max_param_diff": max_diff(off["params"], ref["params"]),
        "dist_opt_vs_reference_max_param_diff": max_diff(on["params"], ref["params"]),
        "max_param_change": max_diff(off["params"], weights),
        "reference_grad_norms": ref["norms"],
        "reference_losses": ref["losses"],
        "grad_norms": {str(f): [s["grad_norm"] for s in r["steps"]] for f, r in runs.items()},
        "clipped_norms": {str(f): r["clipped_norms"] for f, r in runs.items()},
        "lrs": {str(f): [s["lr"] for s in r["steps"]] for f, r in runs.items()},
        "losses": {str(f): r["losses"] for f, r in runs.items()},
        "clip": CLIP,
    }


def check_lr_schedules():
    """The lr of every update for each decay style, past total_steps; grads are zero (no backward)."""
    weights = initial_weights(SMALL)
    total, result = 6, {}
    for style in ("constant", "linear", "cosine"):
        cfg = OptimizerConfig(lr=1.0, min_lr=0.1, lr_warmup_steps=2, lr_decay_style=style, weight_decay=0.05)
        chunks = model(SMALL, weights, dist_opt=cfg.use_distributed_optimizer)
        opt = build_optimizer(chunks, cfg, total_steps=total)
        lrs = []
        for _ in range(total + 2):
            opt.zero_grad()
            lrs.append(opt.step()["lr"])
        groups = opt.optimizer.param_groups
        result[style] = {
            "lrs": lrs,
            "weight_decays": sorted({g["weight_decay"] for g in groups}),
            "num_updates": opt.num_updates,
        }
    try:
        build_optimizer(model(SMALL, weights, dist_opt=False), OptimizerConfig(), total_steps=total)
        result["mismatch_error"] = ""
    except ValueError as e:
        result["mismatch_error"] = str(e)
    return result


def check_grad_norm_without_clipping():
    """clip_grad=0: megatron measures no norm then; TrainOptimizer still reports it (first batch).
    Zeros in the gradient are counted on request; counted here directly in DDP's main_grad too."""
    weights = initial_weights(SMALL)
    tokens = batches(SMALL, 1)[0]
    result = {"grad_norms": {}}
    for dist_opt in (False, True):
        chunks = model(SMALL, weights, dist_opt=dist_opt)
        cfg = OptimizerConfig(clip_grad=0.0, use_distributed_optimizer=dist_opt)
        step = train_step(
            chunks, build_optimizer(chunks, cfg, total_steps=1, log_num_zeros=True), tokens, SMALL
        )[1]
        result["grad_norms"][str(dist_opt)] = step["grad_norm"]
        if not dist_opt:  # the full main_grad is valid on every rank only without the distributed optimizer
            result["num_zeros"] = step["num_zeros"]
            result["zeros_in_main_grad"] = sum(
                (p.main_grad == 0).sum().item() for p in chunks[0].parameters()
            )
    return result


def check_nonfinite_update_is_skipped():
    """A NaN loss on one data-parallel rank: every rank skips the update (params, Adam state, LR
    schedule untouched, gradients zeroed), and the next finite step gives what it gives without the
    NaN step in between — distributed optimizer on and off."""
    weights = initial_weights(SMALL)
    first, second = batches(SMALL, 2)
    result = {}
    for dist_opt in (False, True):
        cfg = OptimizerConfig(**SCHEDULE, clip_grad=CLIP, use_distributed_optimizer=dist_opt)
        runs = {}
        for with_nan in (True, False):
            chunks = model(SMALL, weights, dist_opt=dist_opt)
            opt = build_optimizer(chunks, cfg, total_steps=STEPS)
            train_step(chunks, opt, first, SMALL)
            if with_nan:
                before = [t.clone() for t in optimizer_tensors(opt)]
                params = full_params(chunks)
                updates, lr = opt.num_updates, opt.lr
                _, bad = train_step(chunks, opt, second, SMALL, nan_on_rank=1)
                decisions = [None] * dist.get_world_size()
                dist.all_gather_object(decisions, (bad["update_successful"], bad["nonfinite"]))
                after = optimizer_tensors(opt)
                bad_step = {
                    "decisions": decisions,
                    "grad_norm_finite": math.isfinite(bad["grad_norm"]),
                    "params_unchanged": max_diff(full_params(chunks), params) == 0.0,
                    "optimizer_state_unchanged": len(before) == len(after)
                    and all(torch.equal(a, b) for a, b in zip(before, after)),
                    "updates_unchanged": opt.num_updates == updates,
                    "lr_unchanged": opt.lr == lr,
                }
            _, good = train_step(chunks, opt, second, SMALL)
            runs[with_nan] = {"params": full_params(chunks), "step": good, "updates": opt.num_updates}
        result[str(dist_opt)] = {
            **bad_step,
            "next_step_successful": runs[True]["step"]["update_successful"],
            "next_step_nonfinite": runs[True]["step"]["nonfinite"],
            "updates_after": [runs[True]["updates"], runs[False]["updates"]],
            "max_param_diff_vs_no_nan_run": max_diff(runs[True]["params"], runs[False]["params"]),
        }
    return result


def check_bf16_mixed_precision():
    """bf16 params, fp32 main params in the optimizer; the loss tracks an fp32 run."""
    weights = initial_weights(SMALL)
    data = batches(SMALL, STEPS)
    fp32 = run_training(SMALL, weights, data, dist_opt=True)
    result = {"fp32_losses": fp32["losses"]}
    for dist_opt in (False, True):
        run = run_training(SMALL, weights, data, dist_opt=dist_opt, dtype="bf16")
        chunks, opt = run["chunks"], run["opt"].optimizer
        inner = [q for group in opt.param_groups for q in group["params"]]
        params = list(chunks[0].module.parameters())
        entry = {
            "losses": run["losses"],
            "param_dtypes": sorted({str(p.dtype) for p in params}),
            "main_param_dtypes": sorted({str(q.dtype) for q in inner}),
            "main_param_numel": sum(q.numel() for q in inner),
            "param_numel": sum(p.numel() for p in params),
            "max_abs_param_diff_vs_fp32": max_diff(run["params"], fp32["params"]),
        }
        if not dist_opt:
            # Float16OptimizerWithFloat16Params: the model params are the main params rounded to bf16.
            pairs = [
                (m, f)
                for mg, fg in zip(
                    opt.chained_optimizers[0].float16_groups,
                    opt.chained_optimizers[0].fp32_from_float16_groups,
                )
                for m, f in zip(mg, fg)
            ]
            entry["params_equal_rounded_main_params"] = all(torch.equal(m, f.to(m.dtype)) for m, f in pairs)
            entry["main_differs_from_rounded"] = any(
                not torch.equal(f, f.to(m.dtype).float()) for m, f in pairs
            )
        result[f"dist_opt_{dist_opt}"] = entry
    # fp16 starts with loss scale 2**32: the first gradients overflow, so the updates are skipped and
    # the LR schedule must not advance.
    run = run_training(SMALL, weights, data[:3], dist_opt=True, dtype="fp16")
    result["fp16"] = {
        "steps": run["steps"],
        "num_updates": run["opt"].num_updates,
        "params_unchanged": max_diff(run["params"], {k: v.half().float() for k, v in weights.items()}) == 0,
    }
    return result


# --- offload ---------------------------------------------------------------------------------------


def optimizer_tensors(opt) -> list[torch.Tensor]:
    """Main params and Adam state of the torch optimizers inside megatron's chained optimizer."""
    out = []
    for inner in (o.optimizer for o in opt.optimizer.chained_optimizers):
        out += [p for group in inner.param_groups for p in group["params"]]
        out += [v for state in inner.state.values() for v in state.values()]
    return out


def _snapshot(chunks, opt) -> dict[str, list[torch.Tensor]]:
    params = list(chunks[0].parameters())
    return {
        "params": [p.detach().clone() for p in params],
        "grads": [p.main_grad.clone() for p in params],
        "optimizer": [t.detach().clone() for t in optimizer_tensors(opt)],
    }


def _equal(a: dict, b: dict) -> dict[str, bool]:
    return {k: len(a[k]) == len(b[k]) and all(torch.equal(x, y) for x, y in zip(a[k], b[k])) for k in a}


def _empty(chunks, opt) -> dict[str, bool]:
    params = list(chunks[0].parameters())
    return {
        "params": all(p.untyped_storage().nbytes() == 0 for p in params),
        "grads": all(p.main_grad.untyped_storage().nbytes() == 0 for p in params),
        "optimizer": all(t.untyped_storage().nbytes() == 0 for t in optimizer_tensors(opt)),
    }


def _report_dict(r) -> dict:
    return {
        "bytes": r.bytes,
        "storages": r.storages,
        "freed": r.device_bytes_freed,
        "seconds": round(r.seconds, 3),
        "target": r.target,
    }


def check_offload_round_trip_and_training_continues(directory: str):
    """Twin models A and B take the same steps; A's params, grads and optimizer state make a round trip
    to host memory and to disk in between. Everything must be bit-exact, and so must the next steps."""
    weights = initial_weights(LARGE)
    data = batches(LARGE, 3)
    cfg = OptimizerConfig(lr=1e-3, clip_grad=1.0, use_distributed_optimizer=True)
    twins = []
    for _ in range(2):
        chunks = model(LARGE, weights, dist_opt=True)
        twins.append((chunks, build_optimizer(chunks, cfg, total_steps=10)))
    for chunks, opt in twins:
        train_step(chunks, opt, data[0], LARGE)
        # Gradients of the next batch, not yet applied: the offload must keep them.
        train_step(chunks, opt, data[1], LARGE, step=False)
    (a_chunks, a_opt), (b_chunks, b_opt) = twins
    n_params = sum(p.numel() for p in a_chunks[0].module.parameters())
    result = {"param_bytes": 4 * n_params, "targets": {}}
    for target in (HostMemory(), DiskFiles(directory)):
        before = _snapshot(a_chunks, a_opt)
        start = time.perf_counter()
        offloads = {
            "params": offload_params(a_chunks, target),
            "grads": offload_grads(a_chunks, target),
            "optimizer": offload_optimizer(a_opt, target),
        }
        empty = _empty(a_chunks, a_opt)
        reloads = {
            "params": reload_params(a_chunks),
            "grads": reload_grads(a_chunks),
            "optimizer": reload_optimizer(a_opt),
        }
        result["targets"][target.name.split(":")[0]] = {
            "offload": {k: _report_dict(r) for k, r in offloads.items()},
            "reload": {k: _report_dict(r) for k, r in reloads.items()},
            "emptied": empty,
            "bit_exact": _equal(before, _snapshot(a_chunks, a_opt)),
            "seconds": round(time.perf_counter() - start, 3),
        }
    # Apply the kept gradients, then one more full step: A (offloaded twice) and B must agree exactly.
    steps = []
    for chunks, opt in twins:
        opt.step()
        steps.append(train_step(chunks, opt, data[2], LARGE))
    result["losses_after_reload"] = [s[0] for s in steps]
    result["grad_norms_after_reload"] = [s[1]["grad_norm"] for s in steps]
    result["params_equal_after_steps"] = all(
        torch.equal(p, q) for p, q in zip(a_chunks[0].parameters(), b_chunks[0].parameters())
    )
    return result


def check_optimizer_offload_moves_only_optimizer_storages(directory: str):
    """Which bytes offload_optimizer moves: Adam moments (+ step counters), plus fp32 main params when
    the model is bf16; never the model's own storages (fp32 main params *are* the model's)."""
    weights = initial_weights(SMALL)
    data = batches(SMALL, 1)
    result = {}
    for dtype, dist_opt in (("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True)):
        run = run_training(SMALL, weights, data, dist_opt=dist_opt, dtype=dtype)
        chunks, opt = run["chunks"], run["opt"]
        before = optimizer_tensors(opt)
        before = [t.clone() for t in before]
        offloaded = offload_optimizer(opt, DiskFiles(directory))
        params_kept = all(p.untyped_storage().nbytes() > 0 for p in chunks[0].parameters())
        reload_optimizer(opt)
        params = list(chunks[0].module.parameters())
        result[f"{dtype}_dist_opt_{dist_opt}"] = {
            "bytes": offloaded.bytes,
            "param_numel": sum(p.numel() for p in params),
            "param_tensors": len(params),
            "params_kept": params_kept,
            "bit_exact": all(torch.equal(a, b) for a, b in zip(before, optimizer_tensors(opt))),
        }
    return result


def check_offload_frozen_reference(directory: str):
    """A model without DDP or optimizer (the frozen reference): offload to disk frees its bytes."""
    weights = initial_weights(LARGE)
    chunk = model(LARGE, weights)[0]
    chunk.requires_grad_(False)
    tokens = batches(LARGE, 1)[0][:1, :-1]
    positions = torch.arange(SEQ).expand_as(tokens)
    with torch.no_grad():
        before = chunk(input_ids=tokens, position_ids=positions, attention_mask=None)
    offloaded = offload_params([chunk], DiskFiles(directory))
    emptied = all(p.untyped_storage().nbytes() == 0 for p in chunk.parameters())
    reloaded = reload_params([chunk])
    with torch.no_grad():
        after = chunk(input_ids=tokens, position_ids=positions, attention_mask=None)
    return {
        "param_bytes": sum(p.numel() * p.element_size() for p in chunk.parameters()),
        "offload": _report_dict(offloaded),
        "reload": _report_dict(reloaded),
        "emptied": emptied,
        "logits_equal": torch.equal(before, after),
    }


OPTIMIZER_CHECKS = [
    check_adam_matches_reference_with_and_without_distributed_optimizer,
    check_lr_schedules,
    check_grad_norm_without_clipping,
    check_nonfinite_update_is_skipped,
    check_bf16_mixed_precision,
]
# These write to the directory given on the command line (the disk target).
OFFLOAD_CHECKS = [
    check_offload_round_trip_and_training_continues,
    check_optimizer_offload_moves_only_optimizer_storages,
    check_offload_frozen_reference,
]


def main(argv: list[str]) -> list[dict]:
    directory, only = argv[0], set(argv[1:])
    results = []
    for check in OPTIMIZER_CHECKS + OFFLOAD_CHECKS:
        name = check.__name__.removeprefix("check_")
        if only and name not in only:
            continue
        start = time.perf_counter()
        result = check(directory) if check in OFFLOAD_CHECKS else check()
        results.append({"check": name, "seconds": round(time.perf_counter() - start, 2), **result})
        ParallelLayout.destroy()
    return results
