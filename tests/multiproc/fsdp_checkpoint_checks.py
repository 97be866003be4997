"""Rank code for test_fsdp_checkpoint: an FSDP2 role's checkpoint (megarl.fsdp.checkpoint) saved at world 2
and resumed at world 2 and at world 1.

A rank program (megarl.distributed.rank_program), argv: HF_DIR (a tiny Llama) WORK_DIR PHASE:
- "world2" (2 ranks): two AdamW steps of the tiny Llama wrapped with fully_shard, save, a third step (the
  reference); then a fresh model loads the checkpoint and takes the third step; the HF export of the
  reference; damaged checkpoints refused. Leaves the reference's step-3 weights and metrics in `dir`.
- "world1" (1 rank): a fresh model loads the world-2 checkpoint and takes the third step.
Every step trains on the same global batch, split evenly over the ranks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megarl.checkpoint import manifest as mf
from megarl.checkpoint.format import CheckpointError
from megarl.checkpoint.hf_export import export_checkpoint_hf
from megarl.config.schema import OptimizerConfig
from megarl.fsdp.checkpoint import export_fsdp_hf, load_fsdp_state, save_fsdp_state
from megarl.fsdp.optimizer import FSDPOptimizer, build_fsdp_optimizer

GLOBAL_BATCH, SEQ = 4, 16
OPTIMIZER = OptimizerConfig(lr=1e-3, min_lr=1e-4, lr_warmup_steps=1, lr_decay_style="cosine", clip_grad=1.0)
TOTAL_STEPS = 6
META = {"dtype": "fp32", "role": "actor"}
WIDER = 4096  # the hidden size of the "other model" a damaged checkpoint claims


def build(hf: str) -> tuple[torch.nn.Module, FSDPOptimizer]:
    """The tiny Llama, each decoder layer and then the root wrapped with fully_shard over the world."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, build_fsdp_optimizer(model, OPTIMIZER, TOTAL_STEPS)


def tied_export(work: Path) -> dict[str, Any]:
    """The HF export of a model whose lm_head is its embedding (a tiny Qwen2): stored once, as the
    model's own save_pretrained does (vLLM refuses an lm_head a tied model lacks)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from megarl.models.tiny import build_tiny_hf

    src = work / "qwen2_tied"
    if dist.get_rank() == 0:
        build_tiny_hf(src, family="qwen2", num_hidden_layers=1)
    dist.barrier()
    model, _ = build(str(src))
    out = export_fsdp_hf(model, str(src), work / "qwen2_export")
    if dist.get_rank() != 0:
        return {}
    exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    return {
        "lm_head_stored": any("lm_head" in k for k in load_file(str(out / "model.safetensors"))),
        "tied": exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr(),
    }


def global_batch(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(3))


def train_step(model, optimizer: FSDPOptimizer) -> dict[str, float]:
    """One update on this rank's share of the global batch; the loss averaged over the ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tokens = global_batch(model.config.vocab_size).chunk(world)[rank]
    optimizer.zero_grad()
    loss = model(input_ids=tokens, labels=tokens).loss
    loss.backward()
    metrics = optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return {"loss": float(mean) / world, "grad_norm": metrics["grad_norm"], "lr": metrics["lr"]}


def full_weights(model) -> dict[str, torch.Tensor]:
    """Every rank: a copy of the full weights (gathered; rank 0 keeps them, the others get {})."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.clone() for k, v in full.items()}  # at world 1 they are the parameters themselves


def local_shards(model) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() for p in model.parameters()]


def everywhere(flag: bool) -> bool:
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def copy_checkpoint(src: Path, dst: Path) -> Path:
    if dist.get_rank() == 0:
        shutil.copytree(src, dst)
    dist.barrier()
    return dst


def refusal(model, optimizer, role_dir: Path, hf: str) -> dict[str, Any]:
    """Load a damaged checkpoint: the error on every rank and whether anything changed."""
    params, moments = (
        local_shards(model),
        [s["exp_avg"].to_local().clone() for s in optimizer.optimizer.state.values()],
    )
    updates = optimizer.num_updates
    try:
        load_fsdp_state(model, optimizer, role_dir, model_path=hf)
        error = None
    except CheckpointError as e:
        error = str(e)
    unchanged = (
        all(torch.equal(a, b) for a, b in zip(params, local_shards(model)))
        and all(
            torch.equal(a, s["exp_avg"].to_local())
            for a, s in zip(moments, optimizer.optimizer.state.values())
        )
        and optimizer.num_updates == updates
    )
    errors: list = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return {"errors": errors, "unchanged": everywhere(unchanged)}


def damaged_checkpoints(ckpt: Path, work: Path, model, optimizer, hf: str) -> dict[str, Any]:
    """Each damage on its own copy of the checkpoint, loaded into a trained model and optimizer."""
    results = {}
    truncated = copy_checkpoint(ckpt, work / "truncated")
    if dist.get_rank() == 0:
        shard = sorted((truncated / "model").glob("*.distcp"))[0]
        shard.write_bytes(shard.read_bytes()[:-100])
    dist.barrier()
    results["truncated"] = refusal(model, optimizer, truncated, hf)
    flipped = copy_checkpoint(ckpt, work / "flipped")
    if dist.get_rank() == 0:
        shard = sorted((flipped / "optimizer").glob("*.distcp"))[-1]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    dist.barrier()
    results["corrupt"] = refusal(model, optimizer, flipped, hf)
    incomplete = copy_checkpoint(ckpt, work / "incomplete")
    if dist.get_rank() == 0:
        (incomplete / mf.MANIFEST_FILE).unlink()
    dist.barrier()
    results["incomplete"] = refusal(model, optimizer, incomplete, hf)
    other = copy_checkpoint(ckpt, work / "other_model")
    if dist.get_rank() == 0:  # as if saved from a wider model: the metadata says so, the manifest agrees
        meta = json.loads((other / "megarl_checkpoint.json").read_text())
        meta["architecture"]["hidden_size"] = WIDER
        (other / "megarl_checkpoint.json").write_text(json.dumps(meta))
        (other / mf.MANIFEST_FILE).unlink()
        mf.write_manifest(other)
    dist.barrier()
    results["other_model"] = refusal(model, optimizer, other, hf)
    megatron = copy_checkpoint(ckpt, work / "megatron")
    if dist.get_rank() == 0:  # what a Megatron role's checkpoint says: no backend, its metadata.json
        meta = json.loads((megatron / "megarl_checkpoint.json").read_text())
        del meta["backend"]
        (megatron / "megarl_checkpoint.json").write_text(json.dumps(meta))
        (megatron / "model" / "metadata.json").write_text("{}")
        (megatron / mf.MANIFEST_FILE).unlink()
        mf.write_manifest(megatron)
    dist.barrier()
    results["megatron"] = refusal(model, optimizer, megatron, hf)
    return results


def world2(hf: str, work: Path) -> dict[str, Any]:
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)
    model, optimizer = build(hf)
    first = [train_step(model, optimizer) for _ in range(2)]
    ckpt = work / "ckpt"
    extra = {"samples_seen": 8, "rank_tensor": torch.arange(3) + rank}
    saved = save_fsdp_state(model, optimizer, ckpt, {**META, "source": hf}, hf, extra)
    draw_after_save = torch.rand(4).tolist()  # the RNG stream a resumed run must continue
    reference = train_step(model, optimizer)
    reference_weights = full_weights(model)
    export = export_fsdp_hf(model, hf, work / "export")
    tied = tied_export(work)

    torch.manual_seed(999)  # a fresh process's other seed: the load must bring back the saved one
    resumed, resumed_opt = build(hf)
    report = load_fsdp_state(resumed, resumed_opt, ckpt, model_path=hf)
    extra_back = report.pop("extra_state")
    draw_after_load = torch.rand(4).tolist()
    saved_weights = full_weights(resumed)  # what the checkpoint holds
    step3 = train_step(resumed, resumed_opt)
    resumed_weights = full_weights(resumed)
    result: dict[str, Any] = {
        "first_steps": first,
        "saved": saved,
        "report": {k: v for k, v in report.items() if k != "seconds"},
        "extra_state": {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in extra_back.items()},
        "rng_equal": everywhere(draw_after_save == draw_after_load),
        "reference": reference,
        "resumed": step3,
        "damaged": damaged_checkpoints(ckpt, work, resumed, resumed_opt, hf),
    }
    if rank == 0:
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM

        result["weights_bit_equal"] = all(
            torch.equal(reference_weights[k], resumed_weights[k]) for k in reference_weights
        )
        result["weights_moved"] = max(
            float((reference_weights[k] - v).abs().max())
            for k, v in AutoModelForCausalLM.from_pretrained(hf).state_dict().items()
        )
        save_file({k: v.contiguous() for k, v in reference_weights.items()}, work / "reference.safetensors")
        (work / "reference.json").write_text(json.dumps(reference))
        exported = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
        state = exported.state_dict()
        result["export"] = {
            "files": sorted(p.name for p in Path(export).iterdir()),
            "class": type(exported).__name__,
            "keys_equal": sorted(state) == sorted(reference_weights),
            "weights_equal": all(torch.equal(state[k], reference_weights[k]) for k in reference_weights),
            "partial_left": Path(str(export) + ".partial").exists(),
        }
        result["tied_export"] = tied
        converted = export_checkpoint_hf(ckpt, work / "converted")  # `megarl convert mcore-to-hf`
        weights = AutoModelForCausalLM.from_pretrained(converted["out"], dtype=torch.float32).state_dict()
        result["convert"] = {
            "keys_equal": sorted(weights) == sorted(saved_weights),
            "weights_equal": all(torch.equal(weights[k], v) for k, v in saved_weights.items()),
        }
    return result


def world1(hf: str, work: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    torch.manual_seed(7)
    model, optimizer = build(hf)
    report = load_fsdp_state(model, optimizer, work / "ckpt", model_path=hf)
    extra = report.pop("extra_state")
    step3 = train_step(model, optimizer)
    weights = full_weights(model)
    reference = load_file(work / "reference.safetensors")
    rel = max(float((weights[k] - v).abs().max() / v.abs().max()) for k, v in reference.items())
    return {
        "report": {k: v for k, v in report.items() if k != "seconds"},
        "extra_state": {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in extra.items()},
        "resumed": step3,
        "reference": json.loads((work / "reference.json").read_text()),
        "max_rel_weight_diff": rel,
    }


def main(argv: list[str]) -> dict[str, Any]:
    hf, work, phase = argv
    return {"world2": world2, "world1": world1}[phase](hf, Path(work))
