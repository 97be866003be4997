"""MegatronWorker: the base of every role whose model is a megatron-core GPTModel.

It is built from its role's resolved spec (`megarl.config.roles.role_spec`): it builds this rank's
model chunks for the role's layout and loads the HF weights, wraps them for training (megatron DDP +
megatron's optimizer) when the spec has an optimizer, and runs micro-batches through megatron's pipeline
schedule. What every backend does alike (micro-batching, forward-only passes, offload, profiling) is
`megarl.workers.model_worker.ModelWorker`; the FSDP twin is `megarl.workers.fsdp_worker.FSDPWorker`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from megarl.config.roles import RoleSpec
from megarl.controller.dispatch import Dispatch, register
from megarl.distributed.platform import platform
from megarl.models.build import attends_packed_thd, build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.forward import LossFn, run_microbatches
from megarl.models.from_hf import ModelArchitecture
from megarl.workers.model_worker import ModelWorker


class MegatronWorker(ModelWorker):
    """One rank of a Megatron role, built from that role's `RoleSpec`."""

    def __init__(self, spec: RoleSpec) -> None:
        p = spec.parallel
        layout = dict(tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp, ep=p.ep, sequence_parallel=p.sequence_parallel)
        super().__init__(spec, layout)
        self.arch = self._architecture()
        self.chunks = self._load_chunks(recompute=spec.trainable and spec.recompute)
        self.packed_thd = attends_packed_thd(self.chunks)
        if spec.router_replay != "disabled" and self.arch.num_experts:
            from megarl.models.moe_replay import ModelRoutes

            self.model_routes = ModelRoutes(self.chunks)
        self.optimizer = None
        if spec.optimizer is not None:  # a trained role
            from megarl.models.ddp import wrap_ddp
            from megarl.models.optimizer import build_optimizer

            opt_cfg = spec.optimizer
            self.chunks = wrap_ddp(self.chunks, use_distributed_optimizer=opt_cfg.use_distributed_optimizer)
            self.optimizer = build_optimizer(self.chunks, opt_cfg, total_steps=spec.total_steps)
        else:
            for chunk in self.chunks:
                chunk.eval()
                chunk.requires_grad_(False)

    # ---- model ---------------------------------------------------------------------------------------

    def _architecture(self) -> ModelArchitecture:
        moe = self.spec.moe
        arch = ModelArchitecture.from_pretrained(self.spec.model.path)
        return arch.with_router_losses(moe.aux_loss_coeff, moe.z_loss_coeff, moe.load_balancing_type)

    def _load_chunks(self, recompute: bool) -> list[torch.nn.Module]:
        from megatron.core import parallel_state

        model = self.spec.model
        # weights built fresh (a critic's value head) come from the default generator, which torch seeds
        # at random per process: seed it, so they are the same on every rank and from run to run
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.spec.seed)
            chunks = build_model_chunks(
                self.arch,
                self.layout,
                model.dtype,
                model.make_vocab_size_divisible_by,
                recompute=recompute,
            )
        chunks = [chunk.to(platform().device) for chunk in chunks]
        load_hf_into_chunks(
            chunks,
            self.arch,
            HFCheckpointReader(model.path),
            parallel_state.get_tensor_model_parallel_rank(),
            self.layout.tp,
        )
        if self.spec.lora is not None:
            self._add_adapters(chunks)
        return chunks

    def _add_adapters(self, chunks: list[torch.nn.Module]) -> None:
        """LoRA (`<role>.lora`): adapters on the targeted projections, everything else frozen; started
        from `lora.adapter_path` when set."""
        from megarl.models.lora.apply import apply_lora
        from megarl.models.lora.peft_io import load_peft_adapter

        lora = self.spec.lora
        assert lora is not None
        apply_lora(chunks, self.arch, lora, seed=self.spec.seed)
        if lora.adapter_path:
            load_peft_adapter(chunks, self.arch, lora, lora.adapter_path)

    def run_microbatches(
        self, microbatches: list[dict[str, torch.Tensor]], loss_fn: LossFn, forward_only: bool, at: str | None
    ) -> list[dict[str, Any]]:
        return run_microbatches(
            self.chunks, microbatches, loss_fn, forward_only=forward_only, at=at, routes=self.model_routes
        )

    def generation_source(self, rollout):
        """(the generation TP groups, the weight source streaming this rank's engine shard) of the
        3D-HybridEngine: megatron's shards regrouped at the plan's byte floor (megarl.hybrid.reshard)."""
        from megarl.distributed.generation_plan import GenerationPlan
        from megarl.hybrid.reshard import Resharder

        gen_ep = rollout.expert_parallel_size > 1  # whole experts per engine rank (vLLM's expert parallelism)
        plan = GenerationPlan.for_layout(self.layout, rollout.tp, self.arch.num_kv_heads, gen_ep=gen_ep)
        source = Resharder(
            self.chunks,
            self.arch,
            plan,
            bucket_bytes=rollout.reshard_bucket_mib << 20,
            naive=rollout.naive_reshard,
        )
        if self.spec.lora is not None:
            return plan.gen_tp_groups, self._lora_source(source, plan)
        return plan.gen_tp_groups, source

    def _lora_source(self, base, plan):
        """LoRA's weight source: adapters only after the first sync, or merged weights (lora.sync)."""
        from megarl.hybrid.lora_sync import AdapterResharder, LoraWeightSync
        from megarl.models.lora.peft_io import peft_config
        from megarl.models.lora.targets import lora_tensors

        lora = self.spec.lora
        assert lora is not None and self.spec.rollout is not None
        mode = "adapter" if self.spec.rollout.lora is not None else "merged"
        names = dict.fromkeys(t.peft for t in lora_tensors(self.arch, lora))
        return LoraWeightSync(
            self.chunks,
            base,
            AdapterResharder(self.chunks, self.arch, lora, plan),
            mode,
            peft_config(names, lora, str(self.spec.model.path)),
            lora.check_sync,
            self.arch.num_kv_heads,
        )

    def write_hf(self, out_dir: str) -> str:
        """Write the current weights as a Hugging Face checkpoint at `out_dir` (collective); returns it."""
        from megarl.checkpoint.hf_export import export_hf

        self.check_loaded()
        if self.spec.lora is not None:
            return self._write_lora(out_dir)
        return str(export_hf(self.chunks, self.arch, self.spec.model.path, out_dir))

    def _write_lora(self, out_dir: str) -> str:
        """LoRA: the merged model at `out_dir` (loads wherever an HF model does) and the PEFT adapter at
        `out_dir`/adapter (`PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model.path), …)`)."""
        from megarl.checkpoint.lora_export import export_lora

        assert self.spec.lora is not None
        export_lora(
            self.chunks,
            self.arch,
            self.spec.lora,
            self.spec.model.path,
            os.path.join(out_dir, "adapter"),
            merged_dir=out_dir,
        )
        return out_dir

    # ---- checkpoint ----------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, role_dir: str, meta: dict | None = None) -> dict:
        """Write this role's full training state (weights, optimizer, LR schedule, RNG, `_extra_state`)
        into `role_dir` (megarl.checkpoint.role); `meta` adds entries to its
        megarl_checkpoint.json. Collective; returns this rank's {rank, seconds, bytes_written}."""
        from megarl.checkpoint.role import save_train_state

        if self.optimizer is None:
            raise ValueError(
                f"the {self.role} role is frozen: it has no training state to checkpoint (its weights are "
                "model.path's)"
            )
        self.check_loaded()
        model = self.spec.model
        base = {
            "dtype": model.dtype,
            "padded_vocab_size": getattr(self.chunks[0].module, "vocab_size", None),
            "source": str(model.path),
            "role": self.role,
        }
        return save_train_state(
            self.chunks,
            self.optimizer,
            role_dir,
            {**base, **(meta or {})},
            model.path,
            self._extra_state(),
            arch=self.arch,
            lora=self.spec.lora,
        )

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, role_dir: str, optimizer: bool = True) -> dict:
        """Resume from `role_dir` (written by `save_checkpoint`, at any layout): weights, and unless
        `optimizer=False` the optimizer state and LR schedule; the RNG only at the saved layout. Raises
        CheckpointError before changing anything when the checkpoint is incomplete, corrupt or of
        another model. Returns a report: what was loaded, rng "restored" or "reseeded (layout changed)",
        seconds."""
        from megarl.checkpoint.role import load_train_state

        self.check_loaded()
        report = load_train_state(
            self.chunks,
            self.optimizer,
            role_dir,
            load_optimizer=optimizer,
            arch=self.arch,
            model_path=str(self.spec.model.path),
            lora=self.spec.lora,
        )
        self._load_extra_state(report.pop("extra_state"))
        return {"rank": self.env.rank, **report}
