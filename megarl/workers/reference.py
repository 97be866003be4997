"""ReferenceWorker: the frozen reference policy, on megatron-core.

    ref_log_prob(batch)  -> Batch(ref_log_probs [n, R]), 0 on padding

It runs in the actor's processes (`make_colocated_groups(backend, pool, {"actor": ..., "ref": ...})`),
so its spec (`role_spec(cfg, "ref")`) carries the actor's layout, devices and offload directory.
"""

from __future__ import annotations

from megarl.config.roles import RoleSpec
from megarl.controller.dispatch import Dispatch, register
from megarl.protocol import Batch
from megarl.workers.log_probs import response_log_probs
from megarl.workers.megatron_worker import MegatronWorker
from megarl.workers.model_worker import ModelWorker


class ReferenceRole(ModelWorker):
    """The reference's logic on either backend."""

    def __init__(self, spec: RoleSpec) -> None:
        if spec.trainable:
            raise ValueError(f"the reference is frozen; got the spec of the trained {spec.role!r} role")
        super().__init__(spec)

    @register(Dispatch.DP_COMPUTE)
    def ref_log_prob(self, batch: Batch) -> Batch:
        """The reference policy's log-prob of every response token (0 on padding)."""
        return response_log_probs(self, batch, "ref_log_probs")


class ReferenceWorker(ReferenceRole, MegatronWorker):
    """The reference on megatron-core."""
