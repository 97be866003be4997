"""Check a HF -> megatron conversion numerically: logits, loss and gradient norm against transformers.

A rank program (megarl.distributed.rank_program; `megarl verify-model` launches it). For every requested
layout it builds the megatron model, loads the HF weights, and compares with the HF model in fp32 on the
same batch:
  max |Δlogits|                     forward only, full vocabulary gathered over TP
  loss, grad norm                   forward+backward, batch split over DP, micro-batches through PP
  round trip                        the loaded weights gathered back to HF tensors: bit-exact
It reports one result per layout; one above tolerance ("passed": false) makes the run exit 1.

With --dtype bf16 both sides run in bf16, where two correct implementations differ by ~1e-2, so no fixed
tolerance means anything. The reference is then transformers in fp32 on the bf16-rounded weights, and
megatron's bf16 error against it must stay within BF16_FACTOR times transformers' own bf16 error against
it, plus a floor (BF16_FLOORS), for each of
  logits    max |Δlogits|
  loss      mean over tokens of |Δ token loss|
  grads     ‖Δ gradients‖ / ‖gradients‖ (bounds the grad norm's relative difference)
The batch loss and grad norm differences are reported too, but not judged: each is a sum of rounding
errors that partly cancel, so one side's can be 10x the other's by luck alone.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist

from megarl.distributed.layout import ParallelLayout
from megarl.distributed.platform import platform
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.llama import checkpoint_tensors
from megarl.models.convert.loader import full_megatron_tensors, load_hf_into_chunks, to_hf_tensors
from megarl.models.ddp import wrap_ddp
from megarl.models.dtypes import torch_dtype
from megarl.models.forward import gather_logits, run_microbatches, vocab_parallel_log_probs
from megarl.models.from_hf import ModelArchitecture
from megarl.models.openblas_linear import gemm_of


def parse_layout(text: str, world_size: int) -> ParallelLayout:
    """'tp2pp2', 'tp1pp2vpp2', 'tp2pp1sp' (sequence parallel), 'tp2pp1ep2sp' (expert parallel) ->
    ParallelLayout over world_size ranks."""
    if "cp" in text:
        raise ValueError(
            f"{text!r}: context parallelism is not verified yet (the batch is not split over CP)"
        )
    sizes = {key: int(value) for key, value in re.findall(r"(vpp|tp|pp|ep)(\d+)", text)}
    if not sizes:
        raise ValueError(f"cannot read a layout from {text!r}; write it like tp2pp1, tp1pp2vpp2 or tp2pp1sp")
    return ParallelLayout(
        world_size=world_size,
        tp=sizes.get("tp", 1),
        pp=sizes.get("pp", 1),
        vpp=sizes.get("vpp"),
        ep=sizes.get("ep", 1),
        sequence_parallel=text.endswith("sp"),
    )


# bf16 verdict: megatron's error <= BF16_FACTOR * transformers' error + floor, per metric. Measured
# on CPU (docs/bench/parity_bf16.md): correct conversions give ratios 0.7-1.2 on the dense tiny families
# and up to 2.0 on the MoE ones (a router flipping a near-tied top-k choice is a discrete jump on either
# side); a dropped norm weight gives 5-7, a doubled rotary base 12-24 (logits of magnitude ~5). The
# floors, far below the errors of a bf16 model, only keep a zero transformers error from failing.
BF16_FACTOR = 3.0
BF16_FLOORS = {"logits": 1e-3, "loss": 1e-4, "grads": 1e-3}


def make_batch(vocab_size: int, batch: int, seq: int, seed: int, pad_id: int | None = None) -> torch.Tensor:
    """Random tokens; `pad_id` becomes the next id: transformers' embedding (padding_idx) gives the pad
    row no gradient where megatron's does, a difference no real batch (pads masked out) sees."""
    tokens = torch.randint(0, vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))
    if pad_id is not None:
        tokens[tokens == pad_id] = (pad_id + 1) % vocab_size
    return tokens


def hf_reference(
    hf_dir: str, arch: ModelArchitecture, tokens: torch.Tensor, dtype: str = "fp32", weights: str = "fp32"
) -> dict:
    """The transformers model computing in `dtype` on the checkpoint's weights rounded to `weights`:
    outputs (vocabulary logits, or per-token scores of a scalar head; fp32), the objective (token-mean
    cross entropy, or mean score, in fp32), and its gradients."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if arch.head == "scalar" else AutoModelForCausalLM
    model = auto.from_pretrained(hf_dir, dtype=torch_dtype(dtype)).to(tokens.device)
    if weights != dtype:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch_dtype(weights)))
    if arch.head == "scalar":
        # HF pools the last token; megarl's head scores every token, so apply `score` to all of them.
        outputs = model.score(model.model(input_ids=tokens[:, :-1]).last_hidden_state).float()
    else:
        outputs = model(input_ids=tokens[:, :-1]).logits.float()
    token_loss = token_losses(outputs, tokens, arch)
    token_loss.mean().backward()
    norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters() if p.grad is not None))
    grads = checkpoint_tensors({name: p.grad.float() for name, p in model.named_parameters()})
    return {
        "logits": outputs.detach(),
        "token_loss": token_loss.detach(),
        "loss": token_loss.mean().item(),
        "grad_norm": norm.item(),
        "grads": grads,
    }


def token_losses(outputs: torch.Tensor, tokens: torch.Tensor, arch: ModelArchitecture) -> torch.Tensor:
    """Each token's loss (cross entropy of the next token, or the score of a scalar head), in fp32."""
    if arch.head == "scalar":
        return outputs.float().flatten()
    return torch.nn.functional.cross_entropy(
        outputs.float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none"
    )


def errors_against(ref: dict, side: dict) -> dict[str, float]:
    """The bf16 verdict's errors of transformers in bf16 (an hf_reference) against the fp32 reference;
    check_layout measures megatron's the same way."""
    grad_sq = sum((g - ref["grads"][name]).double().pow(2).sum() for name, g in side["grads"].items())
    return {
        "logits": (side["logits"] - ref["logits"]).abs().max().item(),
        "loss": (side["token_loss"] - ref["token_loss"]).abs().mean().item(),
        "grads": math.sqrt(grad_sq) / ref["grad_norm"],
    }


def bf16_verdict(megatron: dict[str, float], hf: dict[str, float], factor: float = BF16_FACTOR) -> dict:
    """Per metric: megatron's and transformers' bf16 errors, their ratio, the bound
    factor * hf + floor, and whether megatron's error is within it."""
    verdict = {}
    for metric, floor in BF16_FLOORS.items():
        bound = factor * hf[metric] + floor
        verdict[metric] = {
            "megatron_bf16_err": megatron[metric],
            "hf_bf16_err": hf[metric],
            "ratio": megatron[metric] / hf[metric] if hf[metric] else math.inf,
            "bound": bound,
            "passed": megatron[metric] <= bound,
        }
    return verdict


def _full_output(out: torch.Tensor, arch: ModelArchitecture) -> torch.Tensor:
    return out if arch.head == "scalar" else gather_logits(out, arch.vocab_size)


def megatron_grad_norm(chunks: list[torch.nn.Module]) -> float:
    """The global gradient norm as megatron's optimizer measures it: TP-replicated and tied parameters
    counted once, summed over the model-parallel group, routed experts' (`allreduce=False`) over the
    expert-model-parallel group; frozen parameters (LoRA's base) have none."""
    from megatron.core import parallel_state as ps
    from megatron.core.optimizer.clip_grads import get_grad_norm_fp32
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
    from megatron.core.transformer.module import param_is_not_shared

    params = [
        p
        for chunk in chunks
        for p in chunk.parameters()
        if p.requires_grad and param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p)
    ]
    dense = [p.main_grad for p in params if getattr(p, "allreduce", True)]
    experts = [p.main_grad for p in params if not getattr(p, "allreduce", True)]
    norm = get_grad_norm_fp32(dense, grad_stats_parallel_group=ps.get_model_parallel_group())
    if not experts:
        return norm
    group = ps.get_expert_tensor_model_pipeline_parallel_group()
    return math.hypot(norm, get_grad_norm_fp32(experts, grad_stats_parallel_group=group))


def token_mean_backward(
    chunks, layout: ParallelLayout, tokens: torch.Tensor, token_loss_sum
) -> tuple[list, torch.Tensor]:
    """Forward + backward of the token mean of `token_loss_sum(micro_batch, output)` (a micro-batch's
    summed token loss) over `tokens`: the batch split over DP ranks, one sequence per micro-batch;
    megatron's DDP averages over DP and finalizes tied-embedding, sequence-parallel and q/k-norm
    gradients. Returns (the DDP-wrapped chunks, their main_grads set; the objective, on every rank)."""
    from megatron.core import parallel_state as ps

    chunks = wrap_ddp(chunks)
    for chunk in chunks:
        chunk.zero_grad_buffer()
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    dp, dp_rank = layout.dp, ps.get_data_parallel_rank()
    mine = range(dp_rank * len(inputs) // dp, (dp_rank + 1) * len(inputs) // dp)
    microbatches = [{"input_ids": inputs[i : i + 1], "labels": labels[i : i + 1]} for i in mine]
    total_tokens = labels.numel()

    def token_mean_loss(mb, out):
        loss_sum = token_loss_sum(mb, out)
        # The schedule divides by the micro-batch count and DDP averages over DP: undo both, so the
        # gradient is that of the token mean over the whole batch.
        return loss_sum * len(microbatches) * dp / total_tokens, {"loss_sum": loss_sum.detach()}

    outs = run_microbatches(chunks, microbatches, token_mean_loss, forward_only=False)
    last_stage = ps.is_pipeline_last_stage()
    loss = sum(o["loss_sum"].item() for o in outs) / total_tokens if last_stage else 0.0
    loss = torch.tensor(loss, device=tokens.device)
    dist.all_reduce(loss, group=ps.get_data_parallel_group())
    # The loss may be negative (a mean score), so no max: exactly one last-stage rank contributes.
    if not (last_stage and ps.get_tensor_model_parallel_rank() == 0 and dp_rank == 0):
        loss.zero_()
    dist.all_reduce(loss)
    return chunks, loss


def round_trip_exact(chunks, arch: ModelArchitecture, reader: HFCheckpointReader) -> bool:
    """Whether the loaded model, gathered back into HF tensors by every rank (its PP stage: TP, expert-TP
    and EP gathered), gives every checkpoint tensor (rounded to the model's dtype) bit for bit, and only
    those."""
    produced = dict(to_hf_tensors(full_megatron_tensors(chunks, arch), arch))
    exact = all(torch.equal(t, reader.get(name).to(t)) for name, t in produced.items())
    names: list = [None] * dist.get_world_size()
    dist.all_gather_object(names, (exact, sorted(produced)))
    wanted = {n for n in reader.names() if not (arch.head == "scalar" and n == "lm_head.weight")}
    return all(ok for ok, _ in names) and set().union(*(set(n) for _, n in names)) == wanted


def check_layout(
    layout: ParallelLayout,
    arch: ModelArchitecture,
    reader,
    tokens: torch.Tensor,
    ref: dict,
    dtype: str = "fp32",
) -> dict:
    from megatron.core import parallel_state as ps

    layout.initialize()
    chunks = build_model_chunks(arch, layout, dtype)
    load_hf_into_chunks(chunks, arch, reader, ps.get_tensor_model_parallel_rank(), layout.tp)
    inputs = tokens[:, :-1]
    last_stage = ps.is_pipeline_last_stage()

    # Forward only: every micro-batch is one sequence of the full batch.
    outs = run_microbatches(
        chunks,
        [{"input_ids": inputs[i : i + 1]} for i in range(len(inputs))],
        lambda mb, out: (out.sum() * 0, {"logits": _full_output(out, arch).detach()}),
        forward_only=True,
    )
    logit_diff, token_loss_diff = torch.zeros((), device=tokens.device), torch.zeros((), device=tokens.device)
    if last_stage:
        logits = torch.cat([o["logits"] for o in outs]).float()
        logit_diff = (logits - ref["logits"]).abs().max()
        token_loss_diff = (token_losses(logits, tokens, arch) - ref["token_loss"]).abs().mean()

    def token_loss_sum(mb, out):
        if arch.head == "scalar":
            return out.float().sum()
        return -vocab_parallel_log_probs(out, mb["labels"], arch.vocab_size).sum()

    round_trip = round_trip_exact(chunks, arch, reader)
    chunks, loss = token_mean_backward(chunks, layout, tokens, token_loss_sum)
    norm = megatron_grad_norm(chunks)
    hf_grads = to_hf_tensors(full_megatron_tensors(chunks, arch, grads=True), arch)
    grad_diffs = [g.float() - ref["grads"][name] for name, g in hf_grads]
    grad_diff = max(d.abs().max() for d in grad_diffs)
    # Every TP and DP rank of a stage holds its full gradients: one of them counts the stage's part.
    counts = ps.get_tensor_model_parallel_rank() == 0 and ps.get_data_parallel_rank() == 0
    grad_sq = sum(d.double().pow(2).sum().item() for d in grad_diffs) if counts else 0.0
    grad_sq = torch.tensor(grad_sq, device=tokens.device)
    dist.all_reduce(grad_sq)

    # Only last-stage ranks hold logits and loss: a max over the world spreads them.
    stats = torch.stack([logit_diff.float(), grad_diff.float(), token_loss_diff.float()])
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    layout.destroy()
    return {
        "layout": layout.describe(),
        "max_abs_logit_diff": stats[0].item(),
        "loss": loss.item(),
        "head": arch.head,
        "hf_logits_abs_max": ref["logits"].abs().max().item(),
        "hf_loss": ref["loss"],
        "loss_abs_diff": abs(loss.item() - ref["loss"]),
        "grad_norm": norm,
        "hf_grad_norm": ref["grad_norm"],
        "grad_norm_rel_diff": abs(norm - ref["grad_norm"]) / ref["grad_norm"],
        "max_abs_grad_diff": stats[1].item(),
        "token_loss_mean_abs_diff": stats[2].item(),
        "grad_rel_l2_diff": math.sqrt(grad_sq.item()) / ref["grad_norm"],
        "gemm": gemm_of(chunks),
        "round_trip_exact": round_trip,
    }


def main(argv: list[str]) -> list[dict]:
    parser = argparse.ArgumentParser(prog="megarl.models.verify", description=__doc__)
    parser.add_argument("--hf", required=True, action="append", help="HF checkpoint dir (repeatable)")
    parser.add_argument("--layouts", default="tp1pp1", help="comma-separated, e.g. tp1pp1,tp2pp1,tp1pp2")
    parser.add_argument("--tolerance", type=float, default=5e-5, help="fp32: max |Δlogits| and |Δloss|")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--bf16-factor", type=float, default=BF16_FACTOR, help="bf16: see BF16_FACTOR")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    results = []
    for hf_dir in args.hf:
        arch = ModelArchitecture.from_pretrained(hf_dir)
        reader = HFCheckpointReader(hf_dir)
        pad_id = json.loads((Path(hf_dir) / "config.json").read_text()).get("pad_token_id")
        tokens = make_batch(arch.vocab_size, args.batch, args.seq, args.seed, pad_id).to(platform().device)
        ref = hf_reference(hf_dir, arch, tokens, weights=args.dtype)
        hf_errors = (
            errors_against(ref, hf_reference(hf_dir, arch, tokens, "bf16", "bf16"))
            if args.dtype == "bf16"
            else None
        )
        for text in args.layouts.split(","):
            start = time.perf_counter()
            layout = parse_layout(text, dist.get_world_size())
            result = check_layout(layout, arch, reader, tokens, ref, args.dtype)
            result.update(model=hf_dir, family=arch.family, dtype=args.dtype)
            if hf_errors is None:
                within = (
                    result["max_abs_logit_diff"] <= args.tolerance
                    and result["loss_abs_diff"] <= args.tolerance
                    and result["grad_norm_rel_diff"] <= 1e-4
                )
                result.update(tolerance=args.tolerance)
            else:
                megatron_errors = {
                    "logits": result["max_abs_logit_diff"],
                    "loss": result["token_loss_mean_abs_diff"],
                    "grads": result["grad_rel_l2_diff"],
                }
                result.update(
                    bf16=bf16_verdict(megatron_errors, hf_errors, args.bf16_factor),
                    bf16_factor=args.bf16_factor,
                )
                within = all(m["passed"] for m in result["bf16"].values())
            result.update(
                passed=within and result["round_trip_exact"], seconds=round(time.perf_counter() - start, 2)
            )
            results.append(result)
    return results
