"""ParallelLayout: the one object that owns a worker group's parallel sizes and their rules.

`ParallelLayout.check` is the single source of the layout rules: it returns one problem line per broken
rule, naming the key as the user spelled it (`LayoutKeys`: a config key, a field name or a CLI flag) and
how to fix it. Config validation and the CLI report those lines; `ParallelLayout.from_config` and the
constructor raise them as a LayoutError. The layout maps ranks to (tp, cp, dp, pp) coordinates in
megatron's default order ("tp-cp-ep-dp-pp": TP ranks are consecutive, PP is outermost), and initialises
megatron's parallel_state for the current process.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from megarl.errors import EXIT_USAGE, MegarlError


class LayoutError(MegarlError, ValueError):
    """A parallel layout that cannot work; `problems` holds one line per problem, each saying how to fix it."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parallel layout: " + "; ".join(self.problems))

    def __reduce__(self):  # travels between Ray processes with its problem lines
        return LayoutError, (self.problems,)


class ParallelSizes(Protocol):
    """The sizes a layout is made of: a config's `ParallelConfig`, or a `ParallelLayout` itself."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def cp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def vpp(self) -> int | None: ...
    @property
    def sequence_parallel(self) -> bool: ...


@dataclass(frozen=True)
class LayoutKeys:
    """How problem lines name a layout's sizes: the config keys under `prefix` (`actor.parallel.tp`),
    bare field names (prefix ""), or command-line flags (`flags=True`: `--tp`)."""

    prefix: str = ""
    flags: bool = False

    def key(self, name: str) -> str:
        if self.flags:
            return "--" + name.replace("_", "-")
        return f"{self.prefix}.{name}" if self.prefix else name

    def setting(self, name: str, value: int | bool | None) -> str:
        """The size as the user writes it: `actor.parallel.vpp=2`, `--vpp=2`, `--sequence-parallel`."""
        if self.flags and value is True:
            return self.key(name)
        spelled = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        return f"{self.key(name)}={spelled}"

    def unset(self, name: str, off: bool | None) -> str:
        """How to turn an optional feature off: `set actor.parallel.vpp=null`, `drop --vpp`."""
        return f"drop {self.key(name)}" if self.flags else f"set {self.setting(name, off)}"


def divisors(n: int) -> list[int]:
    """1..n's divisors of n: the sizes a problem line offers instead of one that does not divide."""
    return [d for d in range(1, n + 1) if n % d == 0]


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
        problems = ParallelLayout.check(self, self.world_size)
        if problems:
            raise LayoutError(problems)

    @classmethod
    def from_config(
        cls,
        parallel: ParallelSizes,
        world_size: int,
        keys: LayoutKeys = LayoutKeys(),
        world: str | None = None,
    ) -> ParallelLayout:
        """The layout of `parallel` (e.g. a config's `actor.parallel`) over `world_size` ranks; a LayoutError
        with `check`'s lines (named by `keys`, e.g. `LayoutKeys("actor.parallel")`) when it cannot work."""
        problems = cls.check(parallel, world_size, keys, world)
        if problems:
            raise LayoutError(problems)
        return cls(
            world_size=world_size,
            tp=parallel.tp,
            pp=parallel.pp,
            cp=parallel.cp,
            ep=parallel.ep,
            vpp=parallel.vpp,
            sequence_parallel=parallel.sequence_parallel,
        )

    @staticmethod
    def check(
        parallel: ParallelSizes,
        world_size: int | None,
        keys: LayoutKeys = LayoutKeys(),
        world: str | None = None,
    ) -> list[str]:
        """Every rule a layout must obey, as problem lines (empty: it works). `world_size=None` skips the
        rules that need the world (its size is itself invalid); `world` says where it comes from in the
        lines (default "world_size=N")."""
        p, key, setting = parallel, keys.key, keys.setting
        problems = [
            f"{setting(n, getattr(p, n))} must be ≥ 1; use 1 to turn it off"
            for n in ("tp", "pp", "cp", "ep")
            if getattr(p, n) < 1
        ]
        sizes_ok = not problems
        if p.vpp is not None and p.vpp < 1:
            problems.append(f"{setting('vpp', p.vpp)} must be ≥ 1; {keys.unset('vpp', None)} to turn it off")
        elif p.vpp is not None and p.pp == 1:
            problems.append(
                f"{setting('vpp', p.vpp)} needs {key('pp')} > 1; {keys.unset('vpp', None)} or raise {key('pp')}"
            )
        if p.sequence_parallel and p.tp == 1:
            problems.append(
                f"{setting('sequence_parallel', True)} needs {key('tp')} > 1; "
                f"{keys.unset('sequence_parallel', False)} or raise {key('tp')}"
            )
        if p.ep > 1 and p.tp > 1 and not p.sequence_parallel:
            problems.append(
                f"{setting('ep', p.ep)} with {setting('tp', p.tp)} needs {setting('sequence_parallel', True)} "
                "(Megatron MoE rule)"
            )
        if world_size is None or not sizes_ok:
            return problems
        world = world or f"world_size={world_size}"
        if world_size < 1:
            return [*problems, f"{world} must be ≥ 1"]
        label = f"{keys.prefix}: " if keys.prefix and not keys.flags else ""
        # megatron lays ranks out twice: tp·cp·dp·pp for the dense layers, tp·ep·dp·pp for the experts.
        for names in (("tp", "pp", "cp"), ("tp", "pp", "ep")) if p.ep > 1 else (("tp", "pp", "cp"),):
            product = math.prod(getattr(p, n) for n in names)
            if world_size % product:
                sizes = "·".join(names)
                problems.append(
                    f"{label}{sizes} = {'·'.join(str(getattr(p, n)) for n in names)} = {product} does not divide "
                    f"{world}; make {sizes} one of {', '.join(map(str, divisors(world_size)))} or use a "
                    f"multiple of {product} devices"
                )
        return problems

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

    def expert_coordinates(self, rank: int) -> tuple[int, int]:
        """(expert-parallel rank, expert-data-parallel rank) of `rank` in megatron's expert layout
        "tp-ep-dp-pp": inside one TP rank and PP stage, the cp·dp ranks are regrouped as ep × (cp·dp/ep)."""
        within_stage = rank // self.tp % (self.cp * self.dp)
        return within_stage % self.ep, within_stage // self.ep

    def ep_group_ranks(self, rank: int) -> list[int]:
        """The ranks holding the other experts of `rank`'s layers (its expert-parallel group), in EP order."""
        ep_rank, _ = self.expert_coordinates(rank)
        first = rank - self.tp * ep_rank
        return [first + self.tp * k for k in range(self.ep)]

    def describe(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.vpp:
            parts.append(f"vpp{self.vpp}")
        if self.sequence_parallel:
            parts.append("sp")
        return "x".join(parts)

    def initialize(self, seed: int = 1234) -> None:
        """Create megatron's process groups for this layout (torch.distributed must be up)."""
        import torch.distributed as dist
        from megatron.core import parallel_state, tensor_parallel

        from megarl.distributed.backend import collective_timeout
        from megarl.distributed.cpu_shims import apply_megatron_shims
        from megarl.distributed.platform import platform

        apply_megatron_shims()

        if dist.get_world_size() != self.world_size:
            raise LayoutError(
                [
                    f"layout {self.describe()} is for world_size={self.world_size}, but torch.distributed "
                    f"has {dist.get_world_size()} ranks; build the layout for that world size"
                ]
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
            # megatron's groups do not inherit the default group's timeout (torch's new_group default is 30 min)
            distributed_timeout_minutes=collective_timeout().total_seconds() / 60,
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
        if not _groups_before_megatron:  # no layout was set up: nothing to tear down (and no collection)
            return
        for group in set(_process_groups()) - set(_groups_before_megatron):
            dist.destroy_process_group(group)
        _groups_before_megatron.clear()
        # a destroyed gloo group's threads end only when its last reference goes: let go of what the
        # layout's models hold (they are unusable without their groups)
        for release in _releases:
            release()
        _forget_rotary_tables()
        gc.collect()

    @staticmethod
    def on_destroy(release: Callable[[], None]) -> None:
        """Run `release` at every teardown of the layout: for what is built under a layout and would
        otherwise keep its process groups alive (each gloo group holds 3 threads and its sockets)."""
        if release not in _releases:
            _releases.append(release)


_groups_before_megatron: list = []
_releases: list[Callable[[], None]] = []
_active: list[ParallelLayout] = []


def _forget_rotary_tables() -> None:
    """Megatron caches rotary tables per (embedding, length) in a class-level lru_cache, which holds the
    embeddings, and through them their context-parallel groups, past their model's life."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    RotaryEmbedding.forward.cache_clear()


def _process_groups() -> list:
    from torch.distributed import distributed_c10d

    return list(distributed_c10d._world.pg_map)
