"""RewardTrainerWorker: the reward model being trained (`megarl rm`), the critic's scalar-head model scored
at the last token as the frozen reward model scores it.

    rm_update(batch, margin)  -> metrics dict: one optimizer step on the Bradley–Terry loss of the pairs
    compute_rm_score(batch)   -> Batch(rm_scores [n]): what `RewardModelWorker` computes from the export
    export_hf(out_dir)        -> an HF `*ForSequenceClassification` checkpoint (num_labels=1, `score.weight`)

It trains in the actor's place (the rm job's only role: `role_spec(cfg, "actor")`, the actor's layout,
batching and optimizer). Pairs come as interleaved rows (chosen0, rejected0, chosen1, …); the driver's
DP split keeps them whole (each rank gets an even count, from an even offset) and the micro-batches are
cut in units of two rows, so row 2i+1 of a micro-batch is the rejected answer of row 2i. The loss is the
mean over the batch's pairs whatever the layout: each micro-batch returns its pairs' losses summed and
divided by the global pair count.
"""

from __future__ import annotations

import torch

from megarl.algorithms.reward_model import bradley_terry_loss
from megarl.controller.dispatch import Dispatch, register
from megarl.protocol import Batch
from megarl.workers.critic import CriticWorker
from megarl.workers.preference_loss import check_whole_pairs
from megarl.workers.reward import last_token_scores
from megarl.workers.sequences import sequences_from_batch
from megarl.workers.train_loop import GlobalCounts, TrainLossFn, train_minibatches


def bradley_terry_loss_fn(margin: float) -> TrainLossFn:
    """train_minibatches' loss function: the model's output at each row's last token is its score."""

    def loss_fn(mb: dict, output: torch.Tensor, counts: GlobalCounts):
        check_whole_pairs(mb["rows"])
        scores = output.reshape(-1).float()  # [k]: one per row, at its last token
        losses, metrics = bradley_terry_loss(scores[0::2], scores[1::2], margin)
        pairs = counts.num_seqs / 2
        return losses.sum() / pairs, {f"rm/{k}": v.sum() / pairs for k, v in metrics.items()}

    return loss_fn


class RewardTrainerWorker(CriticWorker):
    @register(Dispatch.DP_COMPUTE)
    def rm_update(self, batch: Batch, margin: float = 0.0) -> dict[str, float]:
        """One optimizer step on the mean Bradley–Terry loss of the interleaved pairs of `batch` (the chosen
        score must beat the rejected one by `margin`); metrics: loss, rm/accuracy, rm/margin, rm/chosen,
        rm/rejected (means over the pairs), grad_norm, lr."""
        seqs = sequences_from_batch(batch)
        loss_fn = bradley_terry_loss_fn(margin)
        return train_minibatches(self, seqs, {}, loss_fn, len(seqs), epochs=1, group=2, at="last_index")

    @register(Dispatch.DP_COMPUTE)
    def compute_rm_score(self, batch: Batch) -> Batch:
        return last_token_scores(self, batch)

    @register(Dispatch.ONE_TO_ALL)
    def export_hf(self, out_dir: str) -> str:
        """Write the current weights as an HF sequence classifier at `out_dir` (collective); returns it."""
        from megarl.checkpoint.hf_export import export_hf

        self.check_loaded()
        return str(export_hf(self.chunks, self.arch, self.spec.model.path, out_dir))
