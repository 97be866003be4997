"""Checkpoints built without megatron, in one process: what `megarl convert hf-to-mcore` writes, and a
training run's directory around one (for the checks that must never touch a run)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from megarl.checkpoint.format import META_FILE
from megarl.checkpoint.manifest import write_manifest
from megarl.models.convert import llama
from megarl.models.convert.hf_io import copy_hf_metadata
from megarl.models.from_hf import ModelArchitecture

PADDED_VOCAB = 1024


def fake_megatron_checkpoint(hf_dir, out):
    """What `megarl convert hf-to-mcore` writes, built without megatron."""
    arch = ModelArchitecture.from_pretrained(hf_dir)
    hf = load_file(hf_dir / "model.safetensors")
    stacked: dict[str, list[torch.Tensor]] = {}
    state = {}
    for name in llama.megatron_names(arch):
        entry, hf_names = llama.param_map(name, arch)
        full = llama.merge(entry, [hf[n] for n in hf_names], arch)
        if entry.kind.name == "VOCAB":
            full = torch.cat([full, full.new_zeros(PADDED_VOCAB - full.shape[0], full.shape[1])])
        template, layer = llama.split_layer_name(name)
        if layer is None:
            state[name] = full
        else:
            stacked.setdefault(template.replace("{i}.", ""), []).append(full)
    state.update({key: torch.stack(layers) for key, layers in stacked.items()})
    dcp.save(state, checkpoint_id=out / "model", no_dist=True)
    (out / "model" / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist"}))
    copy_hf_metadata(hf_dir, out / "hf")
    (out / META_FILE).write_text(
        json.dumps({"format_version": 1, "dtype": "fp32", "padded_vocab_size": PADDED_VOCAB})
    )
    return out


def fake_fsdp_checkpoint(hf_dir: Path, out: Path) -> Path:
    """An FSDP role's checkpoint (megarl.fsdp.checkpoint) of the weights of `hf_dir`, written in one process
    without FSDP: the same DCP keys (transformers' names, full shapes), metadata and manifest."""
    from transformers import AutoConfig

    from megarl.checkpoint.role_common import hf_fingerprint

    dcp.save(load_file(hf_dir / "model.safetensors"), checkpoint_id=out / "model", no_dist=True)
    copy_hf_metadata(hf_dir, out / "hf")
    config = AutoConfig.from_pretrained(hf_dir)
    meta = {
        "format_version": 1,
        "dtype": "fp32",
        "role": "actor",
        "backend": "fsdp",
        "model_class": config.architectures[0],
        "world_size": 1,
        "has_optimizer": False,
        "architecture": hf_fingerprint(config),
    }
    (out / META_FILE).write_text(json.dumps(meta))
    write_manifest(out)
    return out


def fake_run(hf_dir: Path, run: Path, step: int = 2) -> Path:
    """A training run's directory: checkpoints/step_<step>/actor (a role checkpoint with its manifest),
    trainer_state.json, config.yaml, `latest`, metrics.jsonl. Returns the role checkpoint."""
    step_dir = run / "checkpoints" / f"step_{step}"
    actor = fake_megatron_checkpoint(hf_dir, step_dir / "actor")
    write_manifest(actor)
    (step_dir / "trainer_state.json").write_text(json.dumps({"version": 1, "step": step, "job": "sft"}))
    (step_dir / "config.yaml").write_text("trainer: {}\n")
    (run / "checkpoints" / "latest").write_text(f"step_{step}\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 1.0}) + "\n")
    return actor
