"""Check a HF -> megatron conversion numerically: logits, loss and gradient norm against transformers.

A rank program (megarl.distributed.rank_program; `megarl verify-model` launches it). For every requested
layout it builds the megatron model, loads the HF weights, and compares with the HF model in fp32 on the
same batch:
  max |Δlogits|                     forward only, full vocabulary gathered over TP
  loss, grad norm                   forward+backward, batch split over DP, micro-batches through PP
  round trip                        the loaded weights gathered back to HF tensors: bit-exact
It reports one result per layout; one above tolerance ("passed": false) makes the run exit 1.
"""

from __future__ import annotations

import argparse
import math
import re
import time

import torch
import torch.distributed as dist

from megarl.distributed.layout import ParallelLayout
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.llama import checkpoint_tensors
from megarl.models.convert.loader import full_megatron_tensors, load_hf_into_chunks, to_hf_tensors
from megarl.models.ddp import wrap_ddp
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


def make_batch(vocab_size: int, batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))


def hf_reference(hf_dir: str, arch: ModelArchitecture, tokens: torch.Tensor) -> dict:
    """The transformers model in fp32: outputs (vocabulary logits, or per-token scores of a scalar head),
    the objective (token-mean cross entropy, or mean score), and its gradients."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if arch.head == "scalar":
        model = AutoModelForSequenceClassification.from_pretrained(hf_dir, dtype=torch.float32)
        # HF pools the last token; megarl's head scores every token, so apply `score` to all of them.
        outputs = model.score(model.model(input_ids=tokens[:, :-1]).last_hidden_state)
        objective = outputs.mean()
    else:
        model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
        outputs = model(input_ids=tokens[:, :-1]).logits
        objective = torch.nn.functional.cross_entropy(outputs.flatten(0, 1), tokens[:, 1:].flatten())
    objective.backward()
    norm = torch.sqrt(sum(p.grad.double().pow(2).sum() for p in model.parameters() if p.grad is not None))
    grads = checkpoint_tensors({name: p.grad for name, p in model.named_parameters()})
    return {"logits": outputs.detach(), "loss": objective.item(), "grad_norm": norm.item(), "grads": grads}


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
    loss = torch.tensor(sum(o["loss_sum"].item() for o in outs) / total_tokens if last_stage else 0.0)
    dist.all_reduce(loss, group=ps.get_data_parallel_group())
    # The loss may be negative (a mean score), so no max: exactly one last-stage rank contributes.
    if not (last_stage and ps.get_tensor_model_parallel_rank() == 0 and dp_rank == 0):
        loss.zero_()
    dist.all_reduce(loss)
    return chunks, loss


def round_trip_exact(chunks, arch: ModelArchitecture, reader: HFCheckpointReader) -> bool:
    """Whether the loaded model, gathered back into HF tensors by every rank (its PP stage: TP, expert-TP
    and EP gathered), gives every checkpoint tensor bit for bit, and only those."""
    produced = dict(to_hf_tensors(full_megatron_tensors(chunks, arch), arch))
    exact = all(torch.equal(tensor, reader.get(name)) for name, tensor in produced.items())
    names: list = [None] * dist.get_world_size()
    dist.all_gather_object(names, (exact, sorted(produced)))
    wanted = {n for n in reader.names() if not (arch.head == "scalar" and n == "lm_head.weight")}
    return all(ok for ok, _ in names) and set().union(*(set(n) for _, n in names)) == wanted


def check_layout(
    layout: ParallelLayout, arch: ModelArchitecture, reader, tokens: torch.Tensor, ref: dict
) -> dict:
    from megatron.core import parallel_state as ps

    layout.initialize()
    chunks = build_model_chunks(arch, layout)
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
    logit_diff = torch.zeros(())
    if last_stage:
        logit_diff = (torch.cat([o["logits"] for o in outs]) - ref["logits"]).abs().max()

    def token_loss_sum(mb, out):
        if arch.head == "scalar":
            return out.float().sum()
        return -vocab_parallel_log_probs(out, mb["labels"], arch.vocab_size).sum()

    round_trip = round_trip_exact(chunks, arch, reader)
    chunks, loss = token_mean_backward(chunks, layout, tokens, token_loss_sum)
    norm = megatron_grad_norm(chunks)
    hf_grads = to_hf_tensors(full_megatron_tensors(chunks, arch, grads=True), arch)
    grad_diff = max((g - ref["grads"][name]).abs().max() for name, g in hf_grads)

    # Only last-stage ranks hold logits and loss: a max over the world spreads them.
    stats = torch.stack([logit_diff.float(), grad_diff.float()])
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
        "gemm": gemm_of(chunks),
        "round_trip_exact": round_trip,
    }


def main(argv: list[str]) -> list[dict]:
    parser = argparse.ArgumentParser(prog="megarl.models.verify", description=__doc__)
    parser.add_argument("--hf", required=True, action="append", help="HF checkpoint dir (repeatable)")
    parser.add_argument("--layouts", default="tp1pp1", help="comma-separated, e.g. tp1pp1,tp2pp1,tp1pp2")
    parser.add_argument("--tolerance", type=float, default=5e-5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    results = []
    for hf_dir in args.hf:
        arch = ModelArchitecture.from_pretrained(hf_dir)
        reader = HFCheckpointReader(hf_dir)
        tokens = make_batch(arch.vocab_size, args.batch, args.seq, args.seed)
        ref = hf_reference(hf_dir, arch, tokens)
        for text in args.layouts.split(","):
            start = time.perf_counter()
            result = check_layout(parse_layout(text, dist.get_world_size()), arch, reader, tokens, ref)
            result.update(
                model=hf_dir,
                family=arch.family,
                tolerance=args.tolerance,
                passed=result["max_abs_logit_diff"] <= args.tolerance
                and result["loss_abs_diff"] <= args.tolerance
                and result["grad_norm_rel_diff"] <= 1e-4
                and result["round_trip_exact"],
                seconds=round(time.perf_counter() - start, 2),
            )
            results.append(result)
    return results
