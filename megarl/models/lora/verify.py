"""Check megatron's LoRA against PEFT's on the transformers model (fp32), at any layout.

A rank program (`megarl verify-model --lora-adapter DIR` launches it; tests/multiproc/parity_checks.py
runs it in the shared launch). For each layout, on the same batch:
  init_equals_base       fresh adapters (B = 0) give bitwise the base model's logits
  max_abs_logit_diff     with the PEFT adapter's weights: logits vs PeftModel's (adapter_effect: how
                         far they are from the base's)
  disabled_equals_base   adapters_disabled gives bitwise the base logits again
  merged_logit_diff      the adapters merged into the base weights (merged_weight: the "merged" sync)
                         vs the LoRA model
  loss_abs_diff, max_abs_grad_diff, grad_norm_rel_diff
                         forward+backward through megatron DDP: every adapter gradient vs PEFT's
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.forward import gather_logits, run_microbatches, vocab_parallel_log_probs
from megarl.models.from_hf import ModelArchitecture
from megarl.models.lora.apply import adapters_disabled, apply_lora
from megarl.models.lora.layers import lora_linears
from megarl.models.lora.merge import merged_weight
from megarl.models.lora.peft_io import gather_full_adapter, load_peft_adapter, read_peft_adapter
from megarl.models.verify import make_batch, megatron_grad_norm, parse_layout, token_mean_backward


def peft_reference(hf_dir: str, adapter_dir: str, tokens: torch.Tensor) -> dict:
    """PEFT's LoRA on the transformers model in fp32: logits, token-mean cross entropy, and the adapter
    gradients by PEFT's saved names."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32), adapter_dir, is_trainable=True
    )
    logits = model(input_ids=tokens[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    grads = {n.replace(".default", ""): p.grad for n, p in model.named_parameters() if p.grad is not None}
    norm = torch.sqrt(sum(g.double().pow(2).sum() for g in grads.values())).item()
    return {"logits": logits.detach(), "loss": loss.item(), "grads": grads, "grad_norm": norm}


def adapter_settings(adapter_dir: str) -> SimpleNamespace:
    """The LoRA settings an adapter was made with (what lora.* must say to load it)."""
    config, _ = read_peft_adapter(adapter_dir)
    return SimpleNamespace(
        rank=config["r"],
        alpha=config["lora_alpha"],
        dropout=0.0,
        target_modules=config["target_modules"],
        exclude_modules=[],
        init_A="kaiming",
    )


def _logits(chunks, inputs: torch.Tensor, arch: ModelArchitecture) -> torch.Tensor | None:
    from megatron.core import parallel_state as ps

    outs = run_microbatches(
        chunks,
        [{"input_ids": inputs[i : i + 1]} for i in range(len(inputs))],
        lambda mb, out: (out.sum() * 0, {"logits": gather_logits(out, arch.vocab_size).detach()}),
        forward_only=True,
    )
    return torch.cat([o["logits"] for o in outs]) if ps.is_pipeline_last_stage() else None


@torch.no_grad()
def _merged_logits(chunks, inputs: torch.Tensor, arch: ModelArchitecture) -> torch.Tensor | None:
    """Logits with every LoRA linear's weight replaced by `merged_weight` (adapters must be off)."""
    linears = lora_linears(chunks)
    saved = [linear.weight.detach().clone() for linear in linears]
    merged = [merged_weight(linear) for linear in linears]
    for linear, weight in zip(linears, merged):
        linear.weight.copy_(weight)
    try:
        return _logits(chunks, inputs, arch)
    finally:
        for linear, weight in zip(linears, saved):
            linear.weight.copy_(weight)


def check_lora_layout(layout, arch, hf_dir: str, adapter_dir: str, tokens: torch.Tensor, ref: dict) -> dict:
    from megatron.core import parallel_state as ps

    layout.initialize()
    cfg = adapter_settings(adapter_dir)
    chunks = build_model_chunks(arch, layout)
    load_hf_into_chunks(
        chunks, arch, HFCheckpointReader(hf_dir), ps.get_tensor_model_parallel_rank(), layout.tp
    )
    inputs = tokens[:, :-1]
    last = ps.is_pipeline_last_stage()
    base = _logits(chunks, inputs, arch)
    apply_lora(chunks, arch, cfg, seed=1)
    init = _logits(chunks, inputs, arch)
    load_peft_adapter(chunks, arch, cfg, adapter_dir)
    lora = _logits(chunks, inputs, arch)
    with adapters_disabled(chunks):
        disabled = _logits(chunks, inputs, arch)
        merged = _merged_logits(chunks, inputs, arch)
    flags = torch.tensor(
        [
            float(not last or torch.equal(init, base)),
            float(not last or torch.equal(disabled, base)),
            (lora - ref["logits"]).abs().max().item() if last else 0.0,
            (lora - base).abs().max().item() if last else 0.0,
            (merged - lora).abs().max().item() if last else 0.0,
        ]
    )

    chunks, loss = token_mean_backward(
        chunks,
        layout,
        tokens,
        lambda mb, out: -vocab_parallel_log_probs(out, mb["labels"], arch.vocab_size).sum(),
    )
    norm = megatron_grad_norm(chunks)
    grads = gather_full_adapter(chunks, arch, cfg, grads=True)
    grad_diff = max((g - ref["grads"][name]).abs().max().item() for name, g in grads.items())
    missing = set(ref["grads"]) - set(grads)
    mins = torch.stack([flags[0], flags[1]])
    dist.all_reduce(mins, op=dist.ReduceOp.MIN)
    diff = flags[2:5].clone()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    layout.destroy()
    return {
        "layout": layout.describe(),
        "adapter_tensors": len(grads),
        "missing_grads": sorted(missing),
        "init_equals_base": bool(mins[0]),
        "disabled_equals_base": bool(mins[1]),
        "max_abs_logit_diff": diff[0].item(),
        "adapter_effect": diff[1].item(),  # max |Δlogits| the adapter makes: the comparison means something
        "merged_logit_diff": diff[2].item(),  # the base weights with merged_weight's, adapters off
        "hf_logits_abs_max": ref["logits"].abs().max().item(),
        "loss_abs_diff": abs(loss.item() - ref["loss"]),
        "max_abs_grad_diff": grad_diff,
        "grad_norm_rel_diff": abs(norm - ref["grad_norm"]) / ref["grad_norm"],
    }


def main(argv: list[str]) -> list[dict]:
    parser = argparse.ArgumentParser(prog="megarl.models.lora.verify", description=__doc__)
    parser.add_argument("--hf", required=True)
    parser.add_argument("--lora-adapter", required=True)
    parser.add_argument("--layouts", default="tp1pp1")
    parser.add_argument("--tolerance", type=float, default=5e-5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    arch = ModelArchitecture.from_pretrained(args.hf)
    tokens = make_batch(arch.vocab_size, args.batch, args.seq, args.seed)
    ref = peft_reference(args.hf, args.lora_adapter, tokens)
    results = []
    for text in args.layouts.split(","):
        start = time.perf_counter()
        r = check_lora_layout(
            parse_layout(text, dist.get_world_size()), arch, args.hf, args.lora_adapter, tokens, ref
        )
        r.update(
            model=args.hf,
            family=arch.family,
            tolerance=args.tolerance,
            passed=r["init_equals_base"]
            and r["disabled_equals_base"]
            and not r["missing_grads"]
            and r["max_abs_logit_diff"] <= args.tolerance
            and r["merged_logit_diff"] <= args.tolerance
            and r["loss_abs_diff"] <= args.tolerance
            and r["grad_norm_rel_diff"] <= 1e-4,
            seconds=round(time.perf_counter() - start, 2),
        )
        results.append(r)
    return results
