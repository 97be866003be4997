"""The driver's typed view of each role's worker group: the methods the trainer may call on it, their
dispatch modes and what they return.

    roles.actor: ActorGroup        rollouts = roles.actor.generate(prompts)        -> Batch
    roles.ref: RefGroup            roles.ref.ref_log_prob(batch)                   -> Batch
    roles.critic: CriticGroup      roles.critic.update(batch)                      -> [metrics per DP replica]
    RewardTrainerGroup             the rm job's trained reward model, in the actor's place

A group's methods are bound at run time from its worker class's `@register(mode)` methods
(`megarl.controller.group`); these Protocols name them for readers and the type checker. Each stub
carries its worker method's mode and parameters and returns what the mode collects: DP_COMPUTE and
GEN_DP_COMPUTE give back the Batch (or one item per data-parallel replica), ONE_TO_ALL one item per
rank. `m_async` returns a `GroupFuture` of the same. The worker classes stay the source of truth:
tests/unit/workers/test_groups.py fails when a handle and its worker class differ.

They live beside the workers because they describe them; the trainer, profiler and checkpoints import
them (this module imports no torch, megatron or Ray of its own).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from megarl.controller.dispatch import Dispatch, register
from megarl.controller.group import GroupFuture, GroupHandle
from megarl.protocol import Batch

if TYPE_CHECKING:
    from megarl.algorithms.preference_terms import BatchCounts, PreferenceSettings


@runtime_checkable
class MegatronGroup(GroupHandle, Protocol):
    """What every megatron role answers (`MegatronWorker`): offload, checkpoints, profiling."""

    @register(Dispatch.ONE_TO_ALL)
    def offload(
        self, params: bool | None = None, grads: bool | None = None, optimizer: bool | None = None
    ) -> list[list[dict]]: ...
    def offload_async(
        self, params: bool | None = None, grads: bool | None = None, optimizer: bool | None = None
    ) -> GroupFuture[list[list[dict]]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> list[list[dict]]: ...
    def reload_async(self) -> GroupFuture[list[list[dict]]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, role_dir: str, meta: dict | None = None) -> list[dict]: ...
    def save_checkpoint_async(self, role_dir: str, meta: dict | None = None) -> GroupFuture[list[dict]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, role_dir: str, optimizer: bool = True) -> list[dict]: ...
    def load_checkpoint_async(self, role_dir: str, optimizer: bool = True) -> GroupFuture[list[dict]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def start_profile(self, step: int, out_dir: str, ranks: list[int]) -> list[None]: ...
    def start_profile_async(self, step: int, out_dir: str, ranks: list[int]) -> GroupFuture[list[None]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> list[dict[int, dict[str, float]]]: ...
    def stop_profile_async(self) -> GroupFuture[list[dict[int, dict[str, float]]]]: ...


@runtime_checkable
class ActorGroup(MegatronGroup, Protocol):
    """The policy (`ActorWorker`): rollouts through the 3D-HybridEngine, log-probs, the RL, SFT and
    preference updates, and the HF export."""

    @register(Dispatch.GEN_DP_COMPUTE)
    def generate(self, prompts: Batch, validate: bool = False) -> Batch: ...
    def generate_async(self, prompts: Batch, validate: bool = False) -> GroupFuture[Batch]: ...

    @register(Dispatch.DP_COMPUTE)
    def log_prob(self, batch: Batch) -> Batch: ...
    def log_prob_async(self, batch: Batch) -> GroupFuture[Batch]: ...

    @register(Dispatch.DP_COMPUTE)
    def update(self, batch: Batch) -> list[dict[str, float]]: ...
    def update_async(self, batch: Batch) -> GroupFuture[list[dict[str, float]]]: ...

    @register(Dispatch.DP_COMPUTE)
    def sft_update(self, batch: Batch) -> list[dict[str, float]]: ...
    def sft_update_async(self, batch: Batch) -> GroupFuture[list[dict[str, float]]]: ...

    @register(Dispatch.DP_COMPUTE)
    def preference_update(
        self, batch: Batch, settings: PreferenceSettings, counts: BatchCounts, weight: float = 1.0
    ) -> list[dict[str, float]]: ...
    def preference_update_async(
        self, batch: Batch, settings: PreferenceSettings, counts: BatchCounts, weight: float = 1.0
    ) -> GroupFuture[list[dict[str, float]]]: ...

    @register(Dispatch.DP_COMPUTE)
    def ref_log_prob(self, batch: Batch) -> Batch: ...  # with LoRA: the base, the adapters off
    def ref_log_prob_async(self, batch: Batch) -> GroupFuture[Batch]: ...

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> list[str]: ...
    def export_hf_async(self, out_dir: str) -> GroupFuture[list[str]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def join_bridge(self, host: str, port: int, n_engine_ranks: int, engine_tp: int) -> list[dict]: ...
    def join_bridge_async(
        self, host: str, port: int, n_engine_ranks: int, engine_tp: int
    ) -> GroupFuture[list[dict]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def send_weights(self, version: int) -> list[dict]: ...
    def send_weights_async(self, version: int) -> GroupFuture[list[dict]]: ...


@runtime_checkable
class RolloutGroup(GroupHandle, Protocol):
    """A separate rollout pool (`RolloutWorker`): its engines generate, and take the actor's weights
    shard to shard over the bridge."""

    @register(Dispatch.GEN_DP_COMPUTE)
    def generate(self, prompts: Batch, validate: bool = False) -> Batch: ...
    def generate_async(self, prompts: Batch, validate: bool = False) -> GroupFuture[Batch]: ...

    @register(Dispatch.ONE_TO_ALL)
    def join_bridge(self, host: str, port: int, n_train: int) -> list[dict]: ...
    def join_bridge_async(self, host: str, port: int, n_train: int) -> GroupFuture[list[dict]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def receive_weights(self, version: int) -> list[dict]: ...
    def receive_weights_async(self, version: int) -> GroupFuture[list[dict]]: ...

    @register(Dispatch.ONE_TO_ALL)
    def weights_version(self) -> list[int]: ...
    def weights_version_async(self) -> GroupFuture[list[int]]: ...


@runtime_checkable
class RefGroup(MegatronGroup, Protocol):
    """The frozen reference policy (`ReferenceWorker`, in the actor's processes)."""

    @register(Dispatch.DP_COMPUTE)
    def ref_log_prob(self, batch: Batch) -> Batch: ...
    def ref_log_prob_async(self, batch: Batch) -> GroupFuture[Batch]: ...


@runtime_checkable
class CriticGroup(MegatronGroup, Protocol):
    """The value model (`CriticWorker`)."""

    @register(Dispatch.DP_COMPUTE)
    def values(self, batch: Batch) -> Batch: ...
    def values_async(self, batch: Batch) -> GroupFuture[Batch]: ...

    @register(Dispatch.DP_COMPUTE)
    def update(self, batch: Batch) -> list[dict[str, float]]: ...
    def update_async(self, batch: Batch) -> GroupFuture[list[dict[str, float]]]: ...


@runtime_checkable
class RewardTrainerGroup(CriticGroup, Protocol):
    """The reward model being trained (`RewardTrainerWorker`, in the actor's place in the rm job)."""

    @register(Dispatch.DP_COMPUTE)
    def rm_update(self, batch: Batch, margin: float = 0.0) -> list[dict[str, float]]: ...
    def rm_update_async(self, batch: Batch, margin: float = 0.0) -> GroupFuture[list[dict[str, float]]]: ...

    @register(Dispatch.DP_COMPUTE)
    def compute_rm_score(self, batch: Batch) -> Batch: ...
    def compute_rm_score_async(self, batch: Batch) -> GroupFuture[Batch]: ...

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> list[str]: ...
    def export_hf_async(self, out_dir: str) -> GroupFuture[list[str]]: ...


@runtime_checkable
class RewardModelGroup(GroupHandle, Protocol):
    """A reward model of either backend (`RewardModelWorker`, `HFRewardWorker`): what the RL step calls."""

    @register(Dispatch.DP_COMPUTE)
    def compute_rm_score(self, batch: Batch) -> Batch: ...
    def compute_rm_score_async(self, batch: Batch) -> GroupFuture[Batch]: ...
