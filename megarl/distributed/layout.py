"""ParallelLayout: the one object that owns a worker group's parallel sizes.

It validates the sizes once, maps ranks to (tp, cp, dp, pp) coordinates in megatron's default order
("tp-cp-ep-dp-pp": TP ranks are consecutive, PP is outermost), and initialises megatron's
parallel_state for the current process.
"""

from __future__ import annotations

from dataclasses import dataclass


class LayoutError(ValueError):
    """A parallel layout that cannot work, with a message saying how to fix it."""


@dataclass(frozen=True)
class Coordinates:
    tp: int
    cp: int
    dp: int
    pp: int


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int | None = None
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        problems = []
        for name in ("world_size", "tp", "pp", "cp", "ep"):
            if getattr(self, name) < 1:
                problems.append(f"{name}={getattr(self, name)} must be >= 1")
        model_parallel = self.tp * self.pp * self.cp
        if not problems and self.world_size % model_parallel:
            problems.append(
                f"tp*pp*cp={model_parallel} does not divide world_size={self.world_size}; "
                f"use a world size that is a multiple of {model_parallel} or smaller tp/pp/cp"
            )
        if not problems and self.ep > 1 and self.dp * self.cp % self.ep:
            problems.append(f"ep={self.ep} must divide dp*cp={self.dp * self.cp}")
        if self.vpp is not None and (self.vpp < 1 or self.pp == 1):
            problems.append(
                f"vpp={self.vpp} needs pp > 1 and vpp >= 1 (got pp={self.pp}); unset vpp or raise pp"
            )
        if self.sequence_parallel and self.tp == 1:
            problems.append("sequence_parallel=True needs tp > 1; set sequence_parallel=False or tp >= 2")
        if problems:
            raise LayoutError("invalid parallel layout: " + "; ".join(problems))

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    def coordinates(self, rank: int) -> Coordinates:
        tp = rank % self.tp
        cp = rank // self.tp % self.cp
        dp = rank // (self.tp * self.cp) % self.dp
        pp = rank // (self.tp * self.cp * self.dp)
        return Coordinates(tp=tp, cp=cp, dp=dp, pp=pp)

    def rank(self, c: Coordinates) -> int:
        return c.tp + self.tp * (c.cp + self.cp * (c.dp + self.dp * c.pp))

    def tp_group_ranks(self, rank: int) -> list[int]:
        c = self.coordinates(rank)
        return [self.rank(Coordinates(t, c.cp, c.dp, c.pp)) for t in range(self.tp)]

    def pp_group_ranks(self, rank: int) -> list[int]:
        c = self.coordinates(rank)
        return [self.rank(Coordinates(c.tp, c.cp, c.dp, p)) for p in range(self.pp)]

    def dp_group_ranks(self, rank: int) -> list[int]:
        c = self.coordinates(rank)
        return [self.rank(Coordinates(c.tp, c.cp, d, c.pp)) for d in range(self.dp)]

    def generation_coordinates(self, rank: int, rollout_tp: int) -> tuple[int, int]:
        """(generation DP rank, generation TP rank) of `rank` when the rollout engine runs at TP=rollout_tp.

        The 3D-HybridEngine's grouping (DESIGN §5) lives in megarl.hybrid.plan.GenerationPlan.
        """
        # Imported here: the plan builds on this module (rank order lives here, generation grouping there).
        from megarl.hybrid.plan import GenerationPlan

        plan = GenerationPlan.for_layout(self, rollout_tp)
        return plan.gen_dp_rank(rank), plan.gen_tp_rank(rank)

    def describe(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.vpp:
            parts.append(f"vpp{self.vpp}")
        if self.sequence_parallel:
            parts.append("sp")
        return "x".join(parts)

    def initialize(self, seed: int = 1234) -> None:
        """Create megatron's process groups for this layout (torch.distributed must be up)."""
        import torch.distributed as dist
        from megatron.core import parallel_state, tensor_parallel

        from megarl.distributed.cpu_shims import apply_megatron_shims
        from megarl.distributed.platform import platform

        apply_megatron_shims()

        if dist.get_world_size() != self.world_size:
            raise LayoutError(
                f"layout {self.describe()} is for world_size={self.world_size}, "
                f"but torch.distributed has {dist.get_world_size()} ranks"
            )
        ParallelLayout.destroy()
        _groups_before_megatron[:] = list(_process_groups())
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=self.tp,
            pipeline_model_parallel_size=self.pp,
            virtual_pipeline_model_parallel_size=self.vpp,
            context_parallel_size=self.cp,
            expert_model_parallel_size=self.ep,
            create_gloo_process_groups=platform().gloo_twin_groups,
        )
        tensor_parallel.model_parallel_cuda_manual_seed(seed, force_reset_rng=True)
        _active[:] = [self]

    @staticmethod
    def active() -> ParallelLayout | None:
        """The layout megatron's parallel state was last initialised with in this process, if any."""
        return _active[0] if _active else None

    @staticmethod
    def destroy() -> None:
        """Tear down megatron's groups, and the torch process groups behind them (each holds threads
        and sockets: re-initialising layouts in one process otherwise slows down step by step)."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        _active.clear()
        if _groups_before_megatron:
            for group in set(_process_groups()) - set(_groups_before_megatron):
                dist.destroy_process_group(group)
            _groups_before_megatron.clear()


_groups_before_megatron: list = []
_active: list[ParallelLayout] = []


def _process_groups() -> list:
    from torch.distributed import distributed_c10d

    return list(distributed_c10d._world.pg_map)
