"""The roles on the fsdp backend: the same role logic as on megatron-core (`ActorRole`, `ReferenceRole`,
`CriticRole`), over an FSDP2-sharded transformers model (`FSDPWorker`)."""

from __future__ import annotations

from megarl.workers.actor import ActorRole
from megarl.workers.critic import CriticRole
from megarl.workers.fsdp_worker import FSDPWorker
from megarl.workers.reference import ReferenceRole


class FSDPActorWorker(ActorRole, FSDPWorker):
    """The actor on FSDP: any causal LM transformers and vLLM both run."""


class FSDPReferenceWorker(ReferenceRole, FSDPWorker):
    """The frozen reference on FSDP."""


class FSDPCriticWorker(CriticRole, FSDPWorker):
    """The critic on FSDP: AutoModelForTokenClassification with one label (verl's critic); from a causal
    LM checkpoint its `score` head is drawn fresh from trainer.seed."""

    head = "value"
