"""CriticWorker: the value model (a scalar head on a megatron GPTModel).

    values(batch)  -> Batch(values [n, R]): V(state before response token j), 0 on padding
    update(batch)  -> metrics dict: clipped value loss on `values` (old) and `returns`

Built from `role_spec(cfg, "critic")`, whose model is the critic checkpoint (`critic.model_path`, default
the policy's): a policy LM checkpoint gets a fresh scalar head in place of its LM head
(`ModelArchitecture.with_scalar_head`).
"""

from __future__ import annotations

import torch

from megarl.algorithms.value_loss import clipped_value_loss
from megarl.config.roles import RoleSpec
from megarl.config.schema import AlgorithmConfig
from megarl.controller.dispatch import Dispatch, register
from megarl.models.from_hf import ModelArchitecture
from megarl.protocol import Batch
from megarl.workers.megatron_worker import MegatronWorker
from megarl.workers.model_worker import ModelWorker
from megarl.workers.sequences import sequences_from_batch
from megarl.workers.train_loop import GlobalCounts, train_minibatches


class CriticRole(ModelWorker):
    """The critic's logic on either backend (the backend class comes after it in the bases)."""

    def __init__(self, spec: RoleSpec) -> None:
        if not spec.trainable or spec.algorithm is None:
            raise ValueError(f"the critic needs a trained role's spec; got {spec.role!r}")
        self.algorithm: AlgorithmConfig = spec.algorithm  # the check above: it is set
        super().__init__(spec)

    @staticmethod
    def _token_values(mb: dict, output: torch.Tensor) -> torch.Tensor:
        return output.squeeze(-1).float() * mb["mask"]  # output: at the response positions, [k, R, 1]

    @register(Dispatch.DP_COMPUTE)
    def values(self, batch: Batch) -> Batch:
        seqs = sequences_from_batch(batch)
        out = self.forward_rows(
            seqs,
            lambda mb, output: {"values": self._token_values(mb, output)},
            {"values": (seqs.response_width,)},
        )
        return Batch(tensors=out)

    @register(Dispatch.DP_COMPUTE)
    def update(self, batch: Batch) -> dict[str, float]:
        missing = [k for k in ("values", "returns") if k not in batch.tensors.keys()]
        if missing:
            raise KeyError(f"critic update needs columns {missing} in the batch")
        seqs = sequences_from_batch(batch)
        fields = {"old_values": batch["values"].float(), "returns": batch["returns"].float()}
        mini = self.spec.mini_batch_size // self.layout.dp
        return train_minibatches(self, seqs, fields, self._value_loss, mini, self.spec.epochs)

    def _value_loss(self, mb: dict, output: torch.Tensor, counts: GlobalCounts):
        algo = self.algorithm
        assert algo.loss_agg_mode is not None  # a role spec is built from the resolved config
        mask = mb["mask"]
        loss, metrics = clipped_value_loss(
            self._token_values(mb, output),
            mb["old_values"],
            mb["returns"],
            mask,
            algo.value_clip,
            agg_mode=algo.loss_agg_mode,
            **counts.agg(),
        )
        share = mask.sum() / counts.num_tokens
        out = {f"critic/{k}": torch.as_tensor(v, dtype=torch.float64) * share for k, v in metrics.items()}
        out["critic/vf_loss"] = loss.detach()
        return loss, out


class CriticWorker(CriticRole, MegatronWorker):
    """The critic on megatron-core: the policy checkpoint's LM head replaced by a fresh scalar head."""

    def _architecture(self) -> ModelArchitecture:
        return super()._architecture().with_scalar_head()
