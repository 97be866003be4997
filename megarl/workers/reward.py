"""RewardModelWorker: a megatron scalar-head reward model (HF `*ForSequenceClassification`, one label).

    compute_rm_score(batch) -> Batch(rm_scores [n]): the head's output at the last real token of prompt ‖ response,
    which is what transformers' sequence classifiers pool.

For reward models in another architecture (a DeBERTa/BERT classifier with its own tokenizer), use
`megarl.workers.reward_hf.HFRewardWorker`, which re-tokenises the decoded text; `reward_worker(cfg)`
picks one from `reward.backend`.
"""

from __future__ import annotations

from megarl.config.roles import RoleSpec, role_spec
from megarl.config.schema import MegarlConfig
from megarl.controller.dispatch import Dispatch, register
from megarl.models.from_hf import ModelArchitecture
from megarl.protocol import Batch
from megarl.workers.megatron_worker import MegatronWorker
from megarl.workers.model_worker import ModelWorker
from megarl.workers.sequences import sequences_from_batch


class RewardModelWorker(MegatronWorker):
    def __init__(self, spec: RoleSpec) -> None:
        if spec.trainable:
            raise ValueError(f"the reward model is frozen; got the spec of the trained {spec.role!r} role")
        super().__init__(spec)

    def _architecture(self) -> ModelArchitecture:
        arch = super()._architecture()
        if arch.head != "scalar":
            raise ValueError(
                f"{self.spec.model.path} is a language model, not a reward model: expected an HF "
                "*ForSequenceClassification checkpoint with num_labels=1 (a `score.weight` head)"
            )
        return arch

    @register(Dispatch.DP_COMPUTE)
    def compute_rm_score(self, batch: Batch) -> Batch:
        return last_token_scores(self, batch)


def last_token_scores(worker: ModelWorker, batch: Batch) -> Batch:
    """Batch(rm_scores [n]): a scalar-head model's output at the last real token of each row (the frozen
    reward model's scores, and the one being trained: megarl.workers.reward_trainer)."""
    seqs = sequences_from_batch(batch)
    out = worker.forward_rows(
        seqs,
        lambda mb, output: {"rm_scores": output.squeeze(-1).float()},  # at each last token, [k, 1]
        {"rm_scores": ()},
        at="last_index",
    )
    return Batch(tensors=out)


def reward_worker(cfg: MegarlConfig) -> tuple[type, dict]:
    """(worker class, constructor kwargs) of the reward-model group that `cfg.reward` describes."""
    r = cfg.reward
    if r.backend == "megatron":
        return RewardModelWorker, {"spec": role_spec(cfg, "reward")}
    from megarl.workers.reward_hf import HFRewardWorker

    return HFRewardWorker, {
        "model_path": r.model_path,
        "policy_tokenizer_path": cfg.model.tokenizer_path or cfg.model.path,
        "kind": r.kind,
        "max_length": r.max_length,
        "micro_batch_size": r.micro_batch_size,
        "label_index": r.label_index,
        "dtype": cfg.model.dtype,
        "fsdp": r.backend == "fsdp",
    }
