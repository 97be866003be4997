"""MegatronWorker: the base of every role whose model is a megatron-core GPTModel.

It builds this rank's model chunks for the role's layout and loads the HF weights, optionally wraps
them for training (megatron DDP + megatron's optimizer), splits the sequences of a Batch into
micro-batches (by count, padded; or by a token budget, packed), and runs them through megatron's
pipeline schedule. Per-token results come back in the Batch's [n, R] layout and, under PP, are
broadcast from the last stage so every rank of a replica returns the same thing.

Loss normalisation: the loss of a mini-batch is defined over the WHOLE mini-batch (all micro-batches on
all data-parallel ranks), so each micro-batch computes its share with the global token/sequence counts
and is scaled back up by (micro-batches × DP size), which the schedule and DDP divide out again. Any
split — DP, micro-batch size, token budget — then gives the same loss and gradient.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from megarl.config.schema import MegarlConfig
from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.data.batching import micro_batches_by_count, micro_batches_by_tokens
from megarl.distributed.platform import platform
from megarl.models.build import build_model_chunks
from megarl.models.convert.hf_io import HFCheckpointReader
from megarl.models.convert.loader import load_hf_into_chunks
from megarl.models.forward import run_microbatches
from megarl.models.from_hf import ModelArchitecture
from megarl.workers.sequences import Sequences, build_microbatch, padded_length, scatter_rows

# loss_fn(micro-batch, model output, counts) -> (this micro-batch's share of the mini-batch loss, metrics
# already weighted so that summing them over micro-batches and DP ranks gives the mini-batch value)
TrainLossFn = Callable[[dict, torch.Tensor, "GlobalCounts"], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class GlobalCounts:
    """Denominators of a mini-batch loss, over all its micro-batches and data-parallel ranks."""

    num_tokens: float
    num_seqs: float
    horizon: int  # response columns R: the constant length of seq-mean-token-sum-norm

    def agg(self) -> dict:
        return {"num_tokens": self.num_tokens, "num_seqs": self.num_seqs, "horizon": self.horizon}


_ROLE_SECTIONS = {"actor": "actor", "ref": "ref", "critic": "critic", "reward": "reward"}


class MegatronWorker(Worker):
    """One rank of a Megatron role ("actor", "ref", "critic" or "reward") built from a MegarlConfig."""

    def __init__(self, cfg: MegarlConfig, role: str, trainable: bool, total_steps: int | None = None) -> None:
        if role not in _ROLE_SECTIONS:
            raise ValueError(f"unknown role {role!r}; expected one of {sorted(_ROLE_SECTIONS)}")
        p = cfg.parallel_of(role)
        layout = dict(tp=p.tp, pp=p.pp, vpp=p.vpp, cp=p.cp, ep=p.ep, sequence_parallel=p.sequence_parallel)
        super().__init__(layout_kwargs=layout, rollout_tp=cfg.rollout.tp if role == "actor" else None)
        self.cfg, self.role = cfg, role
        self.role_cfg = getattr(cfg, _ROLE_SECTIONS[role])
        self.arch = self._architecture()
        self.chunks = self._load_chunks(recompute=trainable and cfg.model.gradient_checkpointing)
        self.optimizer = None
        self.offloaded: list[str] = []
        if trainable:
            from megarl.models.ddp import wrap_ddp
            from megarl.models.optimizer import build_optimizer

            opt_cfg = self.role_cfg.optimizer
            self.chunks = wrap_ddp(self.chunks, use_distributed_optimizer=opt_cfg.use_distributed_optimizer)
            steps = total_steps or cfg.trainer.total_steps or 1
            self.optimizer = build_optimizer(self.chunks, opt_cfg, total_steps=steps)
        else:
            for chunk in self.chunks:
                chunk.eval()
                chunk.requires_grad_(False)

    # ---- model ---------------------------------------------------------------------------------------

    def model_path(self) -> str:
        if self.role == "critic":
            return self.cfg.critic.model_path or self.cfg.model.path
        if self.role == "reward":
            return self.cfg.reward.model_path
        return self.cfg.model.path

    def _architecture(self) -> ModelArchitecture:
        return ModelArchitecture.from_pretrained(self.model_path())

    def _load_chunks(self, recompute: bool) -> list[torch.nn.Module]:
        from megatron.core import parallel_state

        model = self.cfg.model
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
            HFCheckpointReader(self.model_path()),
            parallel_state.get_tensor_model_parallel_rank(),
            self.layout.tp,
        )
        return chunks

    # ---- offload -------------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def offload(self, params: bool | None = None, grads: bool | None = None, optimizer: bool | None = None):
        """Move parameters / gradients / optimizer state off the compute device (None = this role's
        offload_params / offload_grads / offload_optimizer setting). Returns one report dict per state:
        bytes moved and the device memory (GPU allocated, or RSS on CPU) before and after."""
        from megarl.hybrid import offload as off

        target = self._offload_target()
        wanted = {
            "params": self.role_cfg.offload_params if params is None else params,
            "grads": getattr(self.role_cfg, "offload_grads", False) if grads is None else grads,
            "optimizer": getattr(self.role_cfg, "offload_optimizer", False)
            if optimizer is None
            else optimizer,
        }
        if self.optimizer is None and (grads or optimizer):
            raise ValueError(
                f"the {self.role} role is frozen: it has no gradients or optimizer state to offload"
            )
        actions = {
            "optimizer": lambda: off.offload_optimizer(self.optimizer, target),
            "grads": lambda: off.offload_grads(self.chunks, target),
            "params": lambda: off.offload_params(self.chunks, target),
        }
        reports = []
        for state, action in actions.items():
            if wanted[state] and state not in self.offloaded and (state == "params" or self.optimizer):
                reports.append(_report_dict(action()))
                self.offloaded.append(state)
        return reports

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> list[dict]:
        """Bring back everything `offload` moved, bit-exact; returns one report dict per state."""
        from megarl.hybrid import offload as off

        actions = {
            "params": lambda: off.reload_params(self.chunks),
            "grads": lambda: off.reload_grads(self.chunks),
            "optimizer": lambda: off.reload_optimizer(self.optimizer),
        }
        reports = [_report_dict(actions[state]()) for state in reversed(self.offloaded)]
        self.offloaded = []
        return reports

    def _offload_target(self):
        from megarl.hybrid.offload import DiskFiles, HostMemory

        directory = (self.cfg.actor if self.role == "ref" else self.role_cfg).offload_dir
        if directory is None:
            return HostMemory()
        return DiskFiles(os.path.join(directory, f"{self.role}-rank{self.env.rank}"))

    def _check_loaded(self) -> None:
        if self.offloaded:
            raise RuntimeError(
                f"the {self.role} role's {', '.join(self.offloaded)} are offloaded; call reload() first"
            )

    # ---- micro-batches -------------------------------------------------------------------------------

    def microbatches(
        self, seqs: Sequences, rows: list[int], fields: dict[str, torch.Tensor] | None = None
    ) -> list[dict[str, torch.Tensor]]:
        """`rows` of `seqs` as equal-shape micro-batches: packed to the token budget when
        `max_tokens_per_micro_batch` is set, else `micro_batch_size` padded rows. Per-token `fields`
        ([n, R] tensors of the whole batch) are sliced into each micro-batch by row."""
        multiple = self.layout.tp if self.layout.sequence_parallel else 1
        budget = self.role_cfg.max_tokens_per_micro_batch
        sub = seqs.subset(rows)
        if budget:
            groups = micro_batches_by_tokens(sub.lengths, budget)
            length = max(sum(sub.lengths[i] for i in g) for g in groups)
            length = -(-length // multiple) * multiple
            mode, rows_per_mb = "pack", 1
        else:
            groups = micro_batches_by_count(len(rows), self.role_cfg.micro_batch_size)
            length, mode, rows_per_mb = padded_length(sub, multiple), "pad", self.role_cfg.micro_batch_size
        thd = mode == "pack" and platform().transformer_engine
        out = []
        for group in groups:
            mb = build_microbatch(sub, group, mode, length, rows_per_mb, thd=thd)
            mb["rows"] = torch.tensor([rows[i] for i in group], dtype=torch.long)
            for name, value in (fields or {}).items():
                mb[name] = value[mb["rows"]]
            out.append({k: v.to(platform().device) for k, v in mb.items()})
        return out

    # ---- forward only --------------------------------------------------------------------------------

    def forward_rows(
        self,
        seqs: Sequences,
        compute: Callable[[dict, torch.Tensor], dict[str, torch.Tensor]],
        shapes: dict[str, tuple[int, ...]],
    ) -> dict[str, torch.Tensor]:
        """Run every sequence forward; `compute(mb, output)` returns per-sequence results ([k, ...] per
        name); returns {name: [n, *shape]} on every rank of the replica (broadcast over PP)."""
        from megatron.core import parallel_state as ps

        self._check_loaded()
        n = len(seqs)
        mbs = self.microbatches(seqs, list(range(n)))

        def loss_fn(mb, output):
            with torch.no_grad():
                values = compute(mb, output)
            return output.sum() * 0, {
                name: (mb["rows"].cpu(), v.detach().cpu()) for name, v in values.items()
            }

        with torch.no_grad():
            outs = run_microbatches(self.chunks, mbs, loss_fn, forward_only=True)
        results = {}
        for name, shape in shapes.items():
            if ps.is_pipeline_last_stage():
                value = scatter_rows([o[name] for o in outs], n).float()
            else:
                value = torch.zeros((n, *shape), dtype=torch.float32)
            results[name] = self._from_last_stage(value)
        return results

    def _from_last_stage(self, value: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state as ps

        if self.layout.pp == 1:
            return value
        value = value.to(platform().device)
        dist.broadcast(
            value,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
        return value.cpu()

    # ---- training ------------------------------------------------------------------------------------

    def train_minibatches(
        self,
        seqs: Sequences,
        fields: dict[str, torch.Tensor],
        loss_fn: TrainLossFn,
        mini_batch_size: int,
        epochs: int,
    ) -> dict[str, float]:
        """`epochs` passes of optimizer steps over mini-batches of `mini_batch_size` local sequences.
        Returns metrics averaged over the optimizer steps (every rank returns the same)."""
        from megatron.core import parallel_state as ps

        self._check_loaded()
        n = len(seqs)
        if mini_batch_size <= 0 or n % mini_batch_size:
            raise ValueError(
                f"{self.role}: {n} sequences on this data-parallel rank cannot be split into mini-batches of "
                f"{mini_batch_size}; make the batch a multiple of ppo_mini_batch_size × rollout.n"
            )
        dp_group = ps.get_data_parallel_group(with_context_parallel=True)
        dp_size = dist.get_world_size(dp_group)
        history: list[dict[str, float]] = []
        for _ in range(epochs):
            for start in range(0, n, mini_batch_size):
                rows = list(range(start, start + mini_batch_size))
                counts = torch.tensor(
                    [float(sum(seqs.response_lens[r] for r in rows)), float(len(rows))], dtype=torch.float64
                )
                dist.all_reduce(counts, group=dp_group)
                global_counts = GlobalCounts(counts[0].item(), counts[1].item(), seqs.response_width)
                mbs = self.microbatches(seqs, rows, fields)
                scale = len(mbs) * dp_size

                def scaled(mb, output, _counts=global_counts, _scale=scale):
                    share, metrics = loss_fn(mb, output, _counts)
                    return share * _scale, {
                        k: v.detach().double().cpu() for k, v in {"loss": share, **metrics}.items()
                    }

                self.optimizer.zero_grad()
                outs = run_microbatches(self.chunks, mbs, scaled, forward_only=False)
                step = self.optimizer.step()
                metrics = self._sum_over_replica(outs, dp_group)
                metrics.update({k: float(v) for k, v in step.items() if isinstance(v, int | float | bool)})
                history.append(metrics)
        # a skipped update (fp16 overflow) has no grad norm: average what was measured
        merged = {}
        for key in history[0]:
            values = [h[key] for h in history if math.isfinite(h[key])]
            merged[key] = sum(values) / len(values) if values else float("nan")
        return merged

    def _sum_over_replica(self, outs: list[dict], dp_group) -> dict[str, float]:
        """Sum micro-batch metrics over micro-batches and DP ranks; every rank gets the values."""
        from megatron.core import parallel_state as ps

        names = sorted(outs[0]) if outs else None
        holder = [names]
        if self.layout.pp > 1:
            dist.broadcast_object_list(
                holder,
                src=ps.get_pipeline_model_parallel_last_rank(),
                group=ps.get_pipeline_model_parallel_group(),
            )
        names = holder[0]
        totals = torch.zeros(len(names), dtype=torch.float64)
        if ps.is_pipeline_last_stage():
            for i, name in enumerate(names):
                totals[i] = sum(o[name].sum() for o in outs)
        totals = self._from_last_stage(totals)
        dist.all_reduce(totals, group=dp_group)
        return {name: totals[i].item() for i, name in enumerate(names)}


def _report_dict(report) -> dict:
    return {**asdict(report), "device_bytes_freed": report.device_bytes_freed}
