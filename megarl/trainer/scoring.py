"""The scoring stages of an RL step: what turns rollouts into `scores`, and the stages that score more
than the step's own rollouts (ReMax's greedy baseline, DAPO's extra batches; validation runs
`scoring_stages(flow)` too).

    generate → reward_model? → reward → [stages a user inserts] → token_rewards → filter_groups? → …

`reward` writes each sequence's `scores`; `token_rewards` places them on each response's last generated
token (adding a multi-turn rollout's `turn_rewards`), where the advantages start. The stages between generate and token_rewards are the scoring: a stage
inserted there changes what trains. `rl_stages.build_rl_dataflow` assembles them with the other stages.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from megarl.algorithms.advantages import scores_to_token_rewards
from megarl.config.schema import MegarlConfig
from megarl.errors import MegarlError
from megarl.protocol import Batch, Col
from megarl.trainer.dataflow import Dataflow, DataflowError, Stage, StepContext
from megarl.workers.groups import ActorGroup, RewardModelGroup

if TYPE_CHECKING:
    from megarl.rewards import RewardComputer

PROMPT_COLUMNS = (Col.PROMPTS, Col.ATTENTION_MASK)
DATASET_COLUMNS = (Col.DATA_SOURCE, Col.GROUND_TRUTH, Col.EXTRA_INFO)  # what the reward function reads
SEQUENCE_COLUMNS = (Col.INPUT_IDS, Col.ATTENTION_MASK, Col.RESPONSES, Col.RESPONSE_MASK)


def remax_baseline_stage(actor: ActorGroup, scoring: Callable[[], list[Stage]]) -> Stage:
    """ReMax: the score of each prompt's greedy response (rollout.val sampling, which validation keeps
    greedy with n=1 for remax), scored by the flow's own scoring stages and carried to its samples."""

    def baseline(ctx: StepContext, prompts: Batch) -> dict:
        greedy = actor.generate(prompts, validate=True)
        for stage in scoring():
            greedy = stage.run(ctx, greedy)
        return {Col.BASELINE_SCORES: greedy[Col.SCORES].float()}

    return Stage("remax_baseline", baseline, reads=PROMPT_COLUMNS, writes=(Col.BASELINE_SCORES,))


def reward_model_stage(reward_model: RewardModelGroup) -> Stage:
    def score(ctx: StepContext, batch: Batch) -> Batch:
        return reward_model.compute_rm_score(batch.select(SEQUENCE_COLUMNS))

    return Stage("reward_model", score, reads=SEQUENCE_COLUMNS, writes=(Col.RM_SCORES,))


def reward_stage(reward: RewardComputer, with_rm: bool) -> Stage:
    """Sequence scores: reward.weights' sum of the rule function on the driver, the reward model's
    scores (`with_rm`) and any weighted column. It reads what `reward.reads` names, so a stage writing a
    weighted column must run before it."""

    def score(ctx: StepContext, batch: Batch) -> dict:
        earlier_errors = ctx.metrics.get("reward/errors", 0.0)
        scores, metrics = reward.score(batch)
        ctx.metrics.update(metrics)
        if "reward/errors" in metrics:  # every batch the step scored (ReMax's, DAPO's extra ones) counts
            ctx.metrics["reward/errors"] += earlier_errors
        return {Col.SCORES: scores.float()}

    return Stage("reward", score, reads=reward.reads(with_rm), writes=(Col.SCORES,))


def token_rewards_stage(turn_rewards: bool = False) -> Stage:
    """Each sequence's score placed on its response's last generated token (response_mask 1: a multi-turn
    response may end with tool output): the token rewards the advantages start from, so a stage that
    changes `scores` must run before this one to reach the update. `turn_rewards`: the batch has the
    multi-turn rollout's `turn_rewards` column, each turn's score on its last generated token, added in."""

    def place(ctx: StepContext, batch: Batch) -> dict:
        mask = batch[Col.RESPONSE_MASK]
        rewards = scores_to_token_rewards(batch[Col.SCORES].float(), mask)
        if Col.TURN_REWARDS in batch:
            if not turn_rewards:
                raise DataflowError(
                    f"the batch has a {Col.TURN_REWARDS!r} column, but stage 'token_rewards' was built without "
                    "it, so the turns' scores would not train: declare the column in the writes of the stage "
                    "that produces it and replace the stage: flow.replace('token_rewards', "
                    "token_rewards_stage(turn_rewards=True))"
                )
            rewards = rewards + checked_turn_rewards(batch[Col.TURN_REWARDS].float(), mask)
        return {Col.TOKEN_LEVEL_SCORES: rewards}

    reads = (Col.SCORES, Col.RESPONSE_MASK) + ((Col.TURN_REWARDS,) if turn_rewards else ())
    return Stage("token_rewards", place, reads=reads, writes=(Col.TOKEN_LEVEL_SCORES,))


class TurnRewardsError(MegarlError, ValueError):
    """A multi-turn rollout put a turn's score where no generated token is."""


def checked_turn_rewards(turn_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`turn_rewards` [n, R], refused when a value sits on a given token (response_mask 0): the advantage
    estimators skip those tokens, so the score would silently not train."""
    if turn_rewards.shape != mask.shape:
        raise TurnRewardsError(
            f"{Col.TURN_REWARDS} has shape {tuple(turn_rewards.shape)}, the response_mask "
            f"{tuple(mask.shape)}: one value per response token"
        )
    misplaced = torch.nonzero((turn_rewards != 0) & (mask <= 0))
    if len(misplaced):
        row, column = misplaced[0].tolist()
        more = f" (and {len(misplaced) - 1} more)" if len(misplaced) > 1 else ""
        raise TurnRewardsError(
            f"{Col.TURN_REWARDS} holds {float(turn_rewards[row, column]):g} at row {row}, response position "
            f"{column}{more}, a given token (response_mask 0: tool output, user turn or padding); a turn's "
            "score belongs on the turn's last generated token (Trajectory.turn_ends)"
        )
    return turn_rewards


def scoring_stages(flow: Dataflow) -> list[Stage]:
    """The stages between generate and token_rewards, as they are now: what turns rollouts into scores
    (reward_model, reward and whatever a user inserted among them)."""
    names = flow.names
    if "generate" not in names or "token_rewards" not in names:
        raise DataflowError(
            f"scoring runs the stages between generate and token_rewards; the graph has {names}"
        )
    return flow.stages[names.index("generate") + 1 : names.index("token_rewards")]


class DynamicSamplingError(MegarlError, RuntimeError):
    """DAPO's dynamic sampling could not fill a batch within algorithm.filter_groups.max_num_gen_batches."""


def filter_groups_stage(
    cfg: MegarlConfig, more_prompts: Callable[[], Batch], scoring: Callable[[], list[Stage]]
) -> Stage:
    """DAPO dynamic sampling: keep the groups whose scores vary; generate and score more prompts
    (`more_prompts()`, through the stages `scoring()` names at run time: the flow's current ones) until
    data.train_batch_size groups are kept."""
    from megarl.rewards.dynamic_sampling import varied_groups

    wanted, n = cfg.data.train_batch_size, cfg.rollout.n
    limit = cfg.algorithm.filter_groups.max_num_gen_batches

    def keep_varied(ctx: StepContext, batch: Batch) -> Batch:
        kept, generated, batches = [], 0, 1
        while True:
            generated += len(batch) // n
            kept.append(batch[varied_groups(batch[Col.SCORES], batch[Col.UID])])
            have = sum(len(b) for b in kept) // n
            if have >= wanted:
                break
            if batches >= limit:
                raise DynamicSamplingError(
                    f"dynamic sampling kept {have} of the {wanted} groups a step needs after {batches} generation "
                    f"batches (the others scored all-equal); raise algorithm.filter_groups.max_num_gen_batches, "
                    "use a larger rollout.n or a task of fitting difficulty"
                )
            batch = more_prompts()
            for stage in scoring():
                batch = stage.run(ctx, batch)
            batches += 1
        ctx.metrics["dynamic_sampling/gen_batches"] = batches
        ctx.metrics["dynamic_sampling/kept_group_frac"] = have / generated
        return Batch.concat(kept)[: wanted * n]

    return Stage("filter_groups", keep_varied, reads=(Col.SCORES, Col.UID), new_rows=True)
