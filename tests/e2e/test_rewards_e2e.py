"""Rewards a verl user brings: their parquet files and reward function unchanged, and a reward model."""

from __future__ import annotations

import logging

import pyarrow.parquet as pq
import pytest
import torch

from megarl.trainer.dataflow import Stage
from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.data import verl_row, write_parquet

pytestmark = pytest.mark.e2e

# A verl reward file that also misbehaves once in every way a reward function can (on whichever row gets
# there first, in any reward process): each must fail its row only, counted in reward/errors.
VERL_REWARD = """
import ctypes, os, sys, time

from megarl.rewards import default_compute_score

CLAIMED = {claimed!r}
KINDS = ("sleep", "exit", "os_exit", "segfault", "none", "nan", "str")


def _claim(kind):
    try:
        os.close(os.open(os.path.join(CLAIMED, kind), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    for kind in KINDS:
        if _claim(kind):
            if kind == "sleep":
                time.sleep(600)
            if kind == "exit":
                sys.exit(3)
            if kind == "os_exit":
                os._exit(1)
            if kind == "segfault":
                ctypes.string_at(0)
            return {{"none": None, "nan": float("nan"), "str": "1.0"}}[kind]
    exact = float(solution_str.strip() == ground_truth)
    # TinyZero's eval of this answer never returns; megarl's countdown reward scores it a wrong equation
    countdown = default_compute_score("countdown", "<answer>99**98**97</answer>", {{"target": 1, "numbers": [99, 98, 97]}})
    return {{"score": exact, "acc": exact, "chars": float(len(solution_str)), "countdown": countdown}}
"""


def test_a_verl_reward_file_and_verl_parquet_drive_a_dapo_run_unchanged(rl_setup, tmp_path, capsys, caplog):
    """verl's files as they are, with DAPO's dynamic sampling (verl's algorithm.filter_groups) on; the
    reward file's hang, sys.exit(3), os._exit(1), segfault and None/NaN/str results fail one row each."""
    from megarl.rewards.dynamic_sampling import varied_groups

    rows = pq.read_table(rl_setup.data / "train.parquet").to_pylist()[:64]
    verl_rows = [
        verl_row(
            r["prompt"][0]["content"], r["reward_model"]["ground_truth"], data_source="my/private_digits"
        )
        for r in rows
    ]
    data = write_parquet(tmp_path / "verl_train.parquet", verl_rows)
    reward_file = tmp_path / "my_reward.py"
    (tmp_path / "claimed").mkdir()
    reward_file.write_text(VERL_REWARD.format(claimed=str(tmp_path / "claimed")))
    cfg = rl_setup.grpo_config(
        tmp_path / "run",
        f"data.train_files=[{data}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
        f"reward.function.path={reward_file}",
        "algorithm.filter_groups.enable=true",
        "trainer.total_steps=1",
        "reward.timeout_s=1",
    )
    seen = {}
    with caplog.at_level(logging.WARNING, logger="megarl.rewards"), RLTrainer(cfg) as trainer:
        trainer.flow.insert_after(
            "filter_groups", Stage("keep", lambda ctx, b: seen.update(batch=b), reads=("scores", "uid"))
        )
        step = trainer.fit()[-1]
    assert trainer.reward._pool is None  # the reward workers stopped with the trainer
    assert step["reward/acc/mean"] >= 0 and step["reward/chars/mean"] > 0
    assert step["reward/errors"] == 7 and step["reward/countdown/mean"] == pytest.approx(0.1)
    assert "| reward errors 7 |" in capsys.readouterr().out
    (failure,) = [r.getMessage() for r in caplog.records if r.name == "megarl.rewards"]  # the first, once
    assert f"reward function compute_score from {reward_file} failed on batch row" in failure
    batch = seen["batch"]  # what the step trained on: full, and only groups whose rewards vary
    assert len(batch) == cfg.data.train_batch_size * cfg.rollout.n
    assert bool(varied_groups(batch["scores"], batch["uid"]).all())
    assert step["reward/mean"] == pytest.approx(batch["scores"].mean().item())
    assert step["dynamic_sampling/gen_batches"] >= 1 and 0 < step["dynamic_sampling/kept_group_frac"] <= 1


def test_rewards_from_a_reward_model_worker(rl_setup, tiny_reward_models, tmp_path):
    cfg = rl_setup.grpo_config(
        tmp_path,
        f"reward.model_path={tiny_reward_models['llama']}",
        "reward.micro_batch_size=16",
        "reward.weights.function=0.0",
        "reward.weights.rm=1.0",
        "trainer.total_steps=1",
        "trainer.eval_every=0",  # validation once, before the step: scored by the reward model too
    )
    seen = {}

    def keep(ctx, batch):
        seen["rm_scores"], seen["scores"] = batch["rm_scores"].clone(), batch["scores"].clone()

    with RLTrainer(cfg) as trainer:
        trainer.flow.insert_after("reward", Stage("keep", keep, reads=("rm_scores", "scores")))
        history = trainer.fit()
    assert "reward_model" in trainer.flow.names and "timing/reward_model" in history[-1]
    assert history[0]["step"] == 0 and "val/reward/mean" in history[0]
    assert torch.allclose(seen["scores"], seen["rm_scores"].float())  # the RM is the whole reward
    assert seen["rm_scores"].std() > 0  # a real model's scores, not a constant
