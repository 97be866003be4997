"""ModelWorker: what every rank of a model role does the same on either backend (megatron-core or FSDP).

It holds the role's resolved spec and its model (`self.chunks`: megatron's model chunks, or the one FSDP
module) and optimizer; splits the sequences of a Batch into micro-batches (by count, padded; or by a
token budget, packed) and runs them through the backend's `run_microbatches`; offloads and reloads the
model's state; profiles calls. Per-token results come back in the Batch's [n, R] layout and, under PP,
are broadcast from the last stage so every rank of a replica returns the same thing. The backends:
`megarl.workers.megatron_worker.MegatronWorker` and `megarl.workers.fsdp_worker.FSDPWorker`; the training loop
over mini-batches is `megarl.workers.train_loop`, the roles' own logic `megarl.workers.actor` & co.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megarl.config.roles import RoleSpec
from megarl.controller.dispatch import Dispatch, register
from megarl.controller.worker import Worker
from megarl.data.batching import micro_batches_by_count, micro_batches_by_tokens
from megarl.distributed.platform import platform
from megarl.models.forward import LossFn
from megarl.models.moe_replay import microbatch_routes
from megarl.observe.profiling import RANK_PROFILER, trace_name
from megarl.workers.sequences import Sequences, build_microbatch, padded_length, scatter_rows


class ModelWorker(Worker):
    """One rank of a model role. Subclasses set `chunks`, `optimizer` (None when frozen), `packed_thd`
    and `arch` (anything with `vocab_size`), and implement `run_microbatches` and the checkpoints."""

    chunks: list[torch.nn.Module]
    optimizer: Any
    packed_thd: bool = False
    arch: Any

    # MoE routing replay (megarl.workers.routes): a ModelRoutes over the chunks when the role replays
    model_routes: Any = None

    def __init__(self, spec: RoleSpec, layout_kwargs: dict | None = None) -> None:
        """`layout_kwargs`: the megatron parallel layout the backend class runs at (the role classes pass
        only `spec`, and the backend class after them in the bases adds its layout)."""
        super().__init__(
            layout_kwargs=layout_kwargs, rollout_tp=spec.rollout.rollout.tp if spec.rollout else None
        )
        self.spec, self.role = spec, spec.role

    def run_microbatches(
        self, microbatches: list[dict[str, torch.Tensor]], loss_fn: LossFn, forward_only: bool, at: str | None
    ) -> list[dict[str, Any]]:
        """Forward (and backward unless forward_only) over equal-shape `microbatches`; the dicts `loss_fn`
        produced, one per micro-batch, on the last pipeline stage (empty elsewhere). Each backpropagated
        scalar is divided by len(microbatches)."""
        raise NotImplementedError

    def generation_source(self, rollout) -> tuple[list[list[int]], Any]:
        """(the generation TP groups, the weight source of this rank) for the 3D-HybridEngine at
        `rollout` (a RolloutConfig)."""
        raise NotImplementedError

    def write_hf(self, out_dir: str) -> str:
        """Write the current weights as a Hugging Face checkpoint at `out_dir` (collective); returns it."""
        raise NotImplementedError

    # ---- offload -------------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def offload(
        self, params: bool | None = None, grads: bool | None = None, optimizer: bool | None = None
    ) -> list[dict]:
        """Move parameters / gradients / optimizer state off the compute device (None = this role's
        offload spec). Returns one report dict per state: bytes moved and the device memory (GPU
        allocated, or RSS on CPU) before and after."""
        from megarl.hybrid.offload import offload_state

        if self.optimizer is None and (grads or optimizer):
            raise ValueError(
                f"the {self.role} role is frozen: it has no gradients or optimizer state to offload"
            )
        o = self.spec.offload
        wanted = {
            "params": o.params if params is None else params,
            "grads": o.grads if grads is None else grads,
            "optimizer": o.optimizer if optimizer is None else optimizer,
        }
        states = {state for state, on in wanted.items() if on}
        return [
            _report_dict(r)
            for r in offload_state(self.chunks, self.optimizer, states, self._offload_target())
        ]

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> list[dict]:
        """Bring back everything `offload` moved, bit-exact; returns one report dict per state."""
        from megarl.hybrid.offload import reload_state

        return [_report_dict(r) for r in reload_state(self.chunks, self.optimizer)]

    def _offload_target(self):
        from megarl.hybrid.offload import DiskFiles, HostMemory

        directory = self.spec.offload.dir
        if directory is None:
            return HostMemory()
        return DiskFiles(os.path.join(directory, f"{self.role}-rank{self.env.rank}"))

    def check_loaded(self) -> None:
        """Raise unless the model's state is on the compute device (nothing offloaded)."""
        from megarl.hybrid.offload import offloaded_states

        offloaded = offloaded_states(self.chunks, self.optimizer)
        if offloaded:
            raise RuntimeError(
                f"the {self.role} role's {', '.join(offloaded)} are offloaded; call reload() first"
            )

    # ---- profiling -----------------------------------------------------------------------------------

    @register(Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int, out_dir: str, ranks: list[int]) -> None:
        """Time every call on this rank until `stop_profile`; on `ranks` also record a torch.profiler
        trace to `<out_dir>/rank_<r>.json` (`<role>_rank_<r>.json` for roles other than the actor). A
        no-op when another role of this process already profiles it (its profile covers this one)."""
        trace = Path(out_dir) / trace_name(self.role, self.env.rank) if self.env.rank in ranks else None
        RANK_PROFILER.start(self.role, trace)

    @register(Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> dict[int, dict[str, float]]:
        """{this rank: {"<role>.<method>": seconds}} since `start_profile`, the trace written; {rank: {}}
        when this role did not start the process's profile."""
        return {self.env.rank: RANK_PROFILER.stop(self.role) or {}}

    # ---- micro-batches -------------------------------------------------------------------------------

    def microbatches(
        self,
        seqs: Sequences,
        rows: list[int],
        fields: dict[str, torch.Tensor] | None = None,
        group: int = 1,
    ) -> list[dict[str, torch.Tensor]]:
        """`rows` of `seqs` as equal-shape micro-batches: packed to the token budget when
        `max_tokens_per_micro_batch` is set, else `micro_batch_size` padded units. A unit is `group`
        consecutive rows that always share a micro-batch, in order (a preference pair: chosen, rejected).
        Per-row `fields` ([n, ...] tensors of the whole batch) are sliced into each micro-batch by row."""
        if len(rows) % group:
            raise ValueError(f"{self.role}: {len(rows)} rows do not form units of {group}")
        multiple = self.layout.tp if self.layout.sequence_parallel else 1
        budget = self.spec.max_tokens_per_micro_batch
        sub = seqs.subset(rows)
        units = len(rows) // group
        if budget:
            unit_lengths = [sum(sub.lengths[u * group : (u + 1) * group]) for u in range(units)]
            if group > 1 and max(unit_lengths, default=0) > budget:
                raise ValueError(
                    f"{self.role}: a micro-batch holds whole pairs, and one has {max(unit_lengths)} tokens "
                    f"(both answers), more than {self.role}.max_tokens_per_micro_batch={budget}; raise it to "
                    f"at least {max(unit_lengths)}"
                )
            unit_groups = micro_batches_by_tokens(unit_lengths, budget)
            length = max(sum(unit_lengths[u] for u in g) for g in unit_groups)
            length = -(-length // multiple) * multiple
            mode, rows_per_mb = "pack", 1
        else:
            unit_groups = micro_batches_by_count(units, self.spec.micro_batch_size)
            length, mode = padded_length(sub, multiple), "pad"
            rows_per_mb = self.spec.micro_batch_size * group
        thd = mode == "pack" and self.packed_thd
        out = []
        for units_of_mb in unit_groups:
            members = [u * group + k for u in sorted(units_of_mb) for k in range(group)]
            mb = build_microbatch(sub, members, mode, length, rows_per_mb, thd=thd)
            mb["rows"] = torch.tensor([rows[i] for i in members], dtype=torch.long)
            if seqs.routes is not None:  # MoE routing replay: this micro-batch's routes in megatron's order
                mb["routes"] = microbatch_routes(seqs.routes, mb)
            for name, value in (fields or {}).items():
                mb[name] = value[mb["rows"]]
            out.append({k: v.to(platform().device) for k, v in mb.items()})
        return out

    # ---- forward only --------------------------------------------------------------------------------

    def forward_rows(
        self,
        seqs: Sequences,
        compute: Callable[[dict, torch.Tensor], dict[str, torch.Tensor]],
        shapes: Mapping[str, tuple[int, ...]],
        at: str = "index",
        routes_out: list[torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Run every sequence forward; `compute(mb, output)`, with the model's output at the positions
        mb[at] (the response tokens, or "last_index": each sequence's last token), returns per-sequence
        results ([k, ...] per name); returns {name: [n, *shape]} on every rank of the replica
        (broadcast over PP). With `routes_out` (an MoE model whose role replays routes) it receives each
        row's live routes [tokens, L, k] (megarl.workers.routes)."""
        from megatron.core import parallel_state as ps

        from megarl.workers.routes import gathered_rows, recording

        self.check_loaded()
        n = len(seqs)
        mbs = self.microbatches(seqs, list(range(n)))
        record = routes_out is not None
        if record and self.model_routes is None:
            raise ValueError(f"{self.role}: recording routes needs an MoE model with router replay on")

        def loss_fn(mb, output):
            with torch.no_grad():
                values = compute(mb, output)
            return output.sum() * 0, {
                name: (mb["rows"].cpu(), v.detach().cpu()) for name, v in values.items()
            }

        with torch.no_grad(), recording(self.model_routes) if record else contextlib.nullcontext():
            outs = self.run_microbatches(mbs, loss_fn, forward_only=True, at=at)
        if routes_out is not None:
            routes_out.extend(gathered_rows(mbs, seqs.lengths, self.layout.sequence_parallel))
        results = {}
        for name, shape in shapes.items():
            if ps.is_pipeline_last_stage():
                value = scatter_rows([o[name] for o in outs], n).float()
            else:
                value = torch.zeros((n, *shape), dtype=torch.float32)
            results[name] = from_last_stage(value, self.layout.pp)
        return results

    def _extra_state(self) -> dict:
        """Role-specific counters a checkpoint carries (JSON values or tensors); none by default."""
        return {}

    def _load_extra_state(self, state: dict) -> None:
        """Take back what `_extra_state` saved (tensors are missing when the layout changed)."""


def from_last_stage(value: torch.Tensor, pp: int) -> torch.Tensor:
    """`value` as the last pipeline stage has it, on every stage (a no-op without PP)."""
    from megatron.core import parallel_state as ps

    if pp == 1:
        return value
    value = value.to(platform().device)
    dist.broadcast(
        value,
        src=ps.get_pipeline_model_parallel_last_rank(),
        group=ps.get_pipeline_model_parallel_group(),
    )
    return value.cpu()


def _report_dict(report) -> dict:
    return {**asdict(report), "device_bytes_freed": report.device_bytes_freed}
