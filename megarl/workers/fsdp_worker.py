"""FSDPWorker: the base of every role whose model is a transformers model sharded with PyTorch FSDP2.

The twin of megarl.workers.megatron_worker.MegatronWorker: built from the role's resolved spec, it loads
the HF checkpoint as transformers' own model (any architecture transformers knows), shards it with
`fully_shard` over the role's data-parallel ranks, and builds a torch optimizer with megatron's LR
schedule (megarl.fsdp.optimizer) when the role is trained. Everything else — micro-batching, the loss
code, forward-only passes, offload, profiling — is `ModelWorker`'s and the roles' own, the same code the
Megatron roles run. Megatron's parallel state is initialised at TP = PP = CP = 1, so its data-parallel
group is the FSDP group and the vocabulary-parallel log-prob functions are plain ones over the full
vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megarl.config.roles import RoleSpec
from megarl.controller.dispatch import Dispatch, register
from megarl.fsdp.forward import run_hf_microbatches
from megarl.fsdp.model import COMPUTE_DTYPES, Head, load_model, output_head, shard_model
from megarl.models.forward import LossFn
from megarl.workers.model_worker import ModelWorker


@dataclass(frozen=True)
class HFArchitecture:
    """What the workers read of a transformers model's config.json (the Megatron path's
    ModelArchitecture has the same first fields)."""

    vocab_size: int  # the logits' width: config.vocab_size
    num_kv_heads: int
    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str
    text_config: dict  # config.json (its text_config where it nests one)

    @classmethod
    def from_pretrained(cls, path: str) -> HFArchitecture:
        config = json.loads((Path(path) / "config.json").read_text())
        text = config.get("text_config", config)
        heads = text.get("num_attention_heads", 1)
        return cls(
            vocab_size=int(text["vocab_size"]),
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            architecture=(config.get("architectures") or ["?"])[0],
            model_type=str(text.get("model_type", config.get("model_type", "?"))),
            text_config=text,
        )


class FSDPWorker(ModelWorker):
    """One rank of an FSDP role, built from that role's `RoleSpec`."""

    head: Head = "lm"  # the critic's is "value"

    def __init__(self, spec: RoleSpec) -> None:
        p = spec.parallel
        if (p.tp, p.pp, p.cp, p.ep) != (1, 1, 1, 1):
            raise ValueError(
                f"{spec.role}: the fsdp backend is data parallel only; its parallel sizes must be 1 "
                f"(got tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep})"
            )
        super().__init__(spec, dict(tp=1, pp=1, cp=1))
        from megatron.core import parallel_state as ps

        self.arch = HFArchitecture.from_pretrained(spec.model.path)
        self.dtype = COMPUTE_DTYPES[spec.model.dtype]
        model = load_model(spec, self.head)
        self.model = shard_model(model, spec, ps.get_data_parallel_group(with_context_parallel=True))
        self.output = output_head(self.model)
        self.chunks = [self.model]
        self.optimizer = None
        if spec.optimizer is not None:
            from megarl.fsdp.optimizer import build_fsdp_optimizer

            self.optimizer = build_fsdp_optimizer(self.model, spec.optimizer, spec.total_steps)

    def run_microbatches(
        self, microbatches: list[dict[str, torch.Tensor]], loss_fn: LossFn, forward_only: bool, at: str | None
    ) -> list[dict[str, Any]]:
        return run_hf_microbatches(
            self.model, self.output, microbatches, loss_fn, forward_only, at, self.dtype
        )

    # ---- the rollout engine --------------------------------------------------------------------------

    def generation_plan(self):
        """The engine's TP groups are runs of rollout.tp consecutive ranks of the FSDP world."""
        from megarl.distributed.fsdp_plan import FSDPGenerationPlan

        return FSDPGenerationPlan.for_hf_config(self.arch.text_config, self.env.world_size, self.rollout_tp)

    def generation_source(self, rollout):
        from megarl.fsdp.weight_sync import FSDPWeightSync

        plan = self.generation_plan()
        # the engine's weights are in the model's dtype (bf16 halves the bytes of the fp32 shards)
        source = FSDPWeightSync(
            self.model,
            plan,
            bucket_bytes=rollout.reshard_bucket_mib << 20,
            naive=rollout.naive_reshard,
            dtype=self.dtype,
        )
        return plan.gen_tp_groups, source

    def write_hf(self, out_dir: str) -> str:
        from megarl.fsdp.checkpoint import export_fsdp_hf

        self.check_loaded()
        return str(export_fsdp_hf(self.model, self.spec.model.path, out_dir))

    # ---- checkpoint ----------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, role_dir: str, meta: dict | None = None) -> dict:
        """Write this role's full training state into `role_dir` with torch's distributed checkpoint
        (megarl.fsdp.checkpoint: the same run tree, manifest and atomicity as the Megatron roles).
        Collective; returns this rank's {rank, seconds, bytes_written}."""
        from megarl.fsdp.checkpoint import save_fsdp_state

        if self.optimizer is None:
            raise ValueError(
                f"the {self.role} role is frozen: it has no training state to checkpoint (its weights are "
                "model.path's)"
            )
        self.check_loaded()
        base = {"dtype": self.spec.model.dtype, "source": str(self.spec.model.path), "role": self.role}
        return save_fsdp_state(
            self.model,
            self.optimizer,
            role_dir,
            {**base, **(meta or {})},
            self.spec.model.path,
            self._extra_state(),
        )

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, role_dir: str, optimizer: bool = True) -> dict:
        """Resume from `role_dir` (written by `save_checkpoint` at any data-parallel size): weights, and
        unless `optimizer=False` the optimizer state and LR schedule; the RNG only at the saved size."""
        from megarl.fsdp.checkpoint import load_fsdp_state

        self.check_loaded()
        report = load_fsdp_state(
            self.model,
            self.optimizer,
            role_dir,
            load_optimizer=optimizer,
            model_path=str(self.spec.model.path),
        )
        self._load_extra_state(report.pop("extra_state"))
        return {"rank": self.env.rank, **report}
