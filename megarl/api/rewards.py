"""The reward controllers of a trainer as stages of its flow: each writes its score as the column of its
name, and the flow's `reward` stage sums the columns with their weights (`reward/<name>/mean` each).

    generate → <name 1> → <name 2> … → reward (Σ weight_i · column_i → scores) → token_rewards → …

A function or rule controller scores on the driver (the RewardComputer the config path uses, with the
controller's function); a model controller runs its worker group (started on first use, on a Ray pool
of its own, from the run's config with the controller's `reward.*` keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from megarl.api.controllers import ControllerError, RewardController
from megarl.config.load import config_from
from megarl.config.schema import MegarlConfig, RewardModelConfig
from megarl.protocol import Batch, Col
from megarl.rewards import RewardComputer
from megarl.rewards.registry import reward_for
from megarl.trainer.dataflow import Stage, StepContext
from megarl.trainer.scoring import DATASET_COLUMNS, SEQUENCE_COLUMNS

Weighted = Sequence[tuple[RewardController, float]]


def weighted(reward: Any) -> list[tuple[RewardController, float]]:
    """A trainer's `reward=`: one controller, a list of controllers (weight 1 each) or of
    (controller, weight) pairs; None = the rule reward registered for each row's data_source."""
    if reward is None:
        return [(RewardController(), 1.0)]
    items = reward if isinstance(reward, (list, tuple)) else [reward]
    out = []
    for item in items:
        rc, weight = item if isinstance(item, tuple) else (item, 1.0)
        if not isinstance(rc, RewardController):
            raise ControllerError(
                f"reward={item!r}: pass a RewardController, a list of them, or (RewardController, weight) pairs"
            )
        out.append((rc, float(weight)))
    names = [rc.name for rc, _ in out]
    if len(set(names)) != len(names):
        raise ControllerError(f"reward controllers need distinct names (name=...); got {names}")
    return out


def sum_computer(cfg: MegarlConfig, tokenizer: Any, rewards: Weighted) -> RewardComputer:
    """The `reward` stage's computer: the controllers' columns with their weights (no function term)."""
    section = RewardModelConfig(weights={"function": 0.0, **{rc.name: w for rc, w in rewards}})
    section.overlong_buffer = cfg.reward.overlong_buffer
    return RewardComputer(section, tokenizer, cfg.rollout.max_tokens or cfg.data.max_response_length)


def score_stage(
    rc: RewardController, cfg: MegarlConfig, tokenizer: Any, data_sources: Sequence[str], pools: tuple = ()
) -> Stage:
    """The stage writing `rc`'s score as the column `rc.name`; a model controller's group starts here
    (on the run's pool of its devices among `pools`, else on its own)."""
    if rc.is_model:
        group = start_model(rc, cfg, pools)

        def score_model(ctx: StepContext, batch: Batch) -> dict:
            out = group.compute_rm_score(batch.select(SEQUENCE_COLUMNS))
            return {rc.name: out[Col.RM_SCORES].float()}

        rc.scorer = Stage(rc.name, score_model, reads=SEQUENCE_COLUMNS, writes=(rc.name,))
        return rc.scorer
    contained = {k: getattr(cfg.reward, k) for k in ("timeout_s", "max_error_fraction", "workers")}
    computer = RewardComputer(RewardModelConfig(**contained), tokenizer)
    if rc.function is not None:
        computer.use_function(rc.function, f"reward function {rc.name}")
    elif rc.rule is not None:
        rule = reward_for(rc.rule)
        if rule is None:
            from megarl.rewards.registry import known_data_sources

            raise ControllerError(
                f"RewardController(rule={rc.rule!r}): no such rule; known: {', '.join(known_data_sources())}"
            )
        computer.use_function(_fixed_source(rule, rc.rule), f"rule {rc.rule}")
    else:
        computer.check_data_sources(data_sources, "data.train_files")

    computer.start()  # its reward workers load while the trainer starts

    def score_function(ctx: StepContext, batch: Batch) -> dict:
        scores, metrics = computer.score(batch)
        errors = metrics.get("reward/errors")
        if errors:
            ctx.metrics[f"reward/{rc.name}/errors"] = errors
            ctx.metrics["reward/errors"] = ctx.metrics.get("reward/errors", 0.0) + errors  # the console's
        return {rc.name: scores.float()}

    reads = (Col.RESPONSES, Col.RESPONSE_MASK, *DATASET_COLUMNS)
    rc.scorer = Stage(rc.name, score_function, reads=reads, writes=(rc.name,))
    return rc.scorer


def start_model(rc: RewardController, cfg: MegarlConfig, pools: tuple = ()) -> Any:
    """`rc`'s reward-model group (started now unless running): the run's config with its reward keys."""
    if rc.group is None:
        from megarl.trainer.roles import start_reward_model

        keys = {"enable": True, "model_path": rc.model_path(Path(cfg.trainer.output_dir)), **rc.section()}
        rc_cfg = config_from(cfg, [{"reward": keys}])
        group, pool = start_reward_model(rc_cfg, pools, rc.name)
        rc.adopt(group, _Stopper(group, pool))
    return rc.group


class _Stopper:
    def __init__(self, group: Any, pool: Any) -> None:
        self.group, self.pool = group, pool

    def shutdown(self) -> None:
        try:
            self.group.shutdown()
        finally:
            if self.pool is not None:  # None: the group ran on the run's pool
                self.pool.remove()


def _fixed_source(rule: Any, source: str) -> Any:
    def score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> Any:
        return rule(source, solution_str, ground_truth, extra_info)

    return score
