"""Masks of a multi-turn rollout (issue 43 item 2): every quantity the trainer computes over a response sees
its generated tokens only. One hand-built trajectory batch with given tokens (tool output, user turns)
inside the responses; each quantity is computed by the function the trainer runs (its stages, the
actor's objective, the critic's loss, the reward's overlong penalty, the step metrics) and compared with
a computation written here from the definition on the same rows COMPRESSED to their generated tokens
(the given ones dropped, computed on the dense sequences, scattered back), at 1e-6. Values at given
positions must be 0, and changing what sits there (log-probs, values, rewards) changes nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from megarl.algorithms.policy_loss import POLICY_LOSSES
from megarl.config import load_config
from megarl.config.schema import MegarlConfig, OverlongBufferConfig, RewardModelConfig
from megarl.config.schema_algorithm import AlgorithmConfig
from megarl.protocol import Batch, Col
from megarl.rewards import RewardComputer
from megarl.trainer.dataflow import DataflowError, StepContext
from megarl.trainer.rl_stages import advantages_stage, build_rl_dataflow, old_log_prob_stage
from megarl.trainer.rl_trainer import batch_statistics
from megarl.trainer.scoring import TurnRewardsError, token_rewards_stage
from megarl.workers.actor_loss import policy_objective
from megarl.workers.train_loop import GlobalCounts
from tests.unit.agentic.holey_batch import (
    AGG_MODES,
    FINISH,
    GENERATED,
    GIVEN,
    MASK,
    SCORES,
    TURN_ENDS,
    R,
    agg,
    close,
    compress,
    dense_batch,
    driver,
    expected_token_scores,
    gae_row,
    k3,
    ppo_token_loss,
    reward_to_go,
    rollout,
    scatter,
    scored,
    tensors,
    whiten,
    with_given,
    zero_on_given,
)

pytestmark = pytest.mark.unit


def test_the_hand_built_batch_has_holes_inside_responses():
    assert GIVEN[0, 3:5].all() and GIVEN[0, 7] and GIVEN[1, 4:7].all() and GIVEN[3, 3:7].all()
    assert not GIVEN[2].any()
    assert [len(g) for g in GENERATED] == [8, 6, 6, 3]
    assert all(ends[-1] == g[-1] for ends, g in zip(TURN_ENDS[:3], GENERATED[:3]))


def test_the_score_lands_on_the_last_generated_token_and_turn_rewards_are_added():
    out = scored(tensors())
    close(out[Col.TOKEN_LEVEL_SCORES], scatter(expected_token_scores()))
    zero_on_given(out[Col.TOKEN_LEVEL_SCORES])
    # row 3 ends with a tool output: its score sits at column 2, not at the last attended column 6
    assert out[Col.TOKEN_LEVEL_SCORES][3, 2] == pytest.approx(-1.0 + 0.25)
    assert token_rewards_stage(turn_rewards=True).reads == (Col.SCORES, Col.RESPONSE_MASK, Col.TURN_REWARDS)


def test_turn_rewards_the_stage_was_not_built_for_or_on_a_given_token_are_refused():
    columns = tensors()
    with pytest.raises(DataflowError, match=r"token_rewards_stage\(turn_rewards=True\)"):
        token_rewards_stage().run(StepContext(step=1), rollout(columns))
    misplaced = columns[Col.TURN_REWARDS].clone()
    misplaced[1, 5] = 0.7  # inside row 1's tool span
    columns[Col.TURN_REWARDS] = misplaced
    with pytest.raises(TurnRewardsError, match="0.7 at row 1, response position 5, a given token"):
        scored(columns)
    # without turn rewards the score alone is placed
    plain = rollout(tensors()).select([Col.SCORES, Col.RESPONSE_MASK])
    out = token_rewards_stage().run(StepContext(step=1), plain)
    close(
        out[Col.TOKEN_LEVEL_SCORES],
        scatter([[0.0] * (len(g) - 1) + [float(s)] for g, s in zip(GENERATED, SCORES)]),
    )


def test_a_multi_turn_graph_declares_the_turn_rewards_it_places():
    cfg = load_config(None, ["algorithm.name=grpo", "rollout.n=4"], check_paths=False)
    roles = SimpleNamespace(actor=object(), ref=None, critic=None, reward_model=None)
    plain, _ = build_rl_dataflow(cfg, roles, RewardComputer.from_config(cfg, None))
    assert Col.TURN_REWARDS not in plain["token_rewards"].reads
    cfg.rollout.multi_turn.enable = True
    flow, _ = build_rl_dataflow(cfg, roles, RewardComputer.from_config(cfg, None))
    assert Col.TURN_REWARDS in flow["generate"].writes and Col.TURN_REWARDS in flow["token_rewards"].reads


# ---------------------------------------------------------------------------------------------------------
# the driver: in-reward KL and the estimators


def test_in_reward_kl_is_charged_on_generated_tokens_only():
    columns = tensors()
    out, metrics = driver(
        columns, adv_estimator="grpo", use_kl_in_reward=True, kl_penalty="low_var_kl", kl_coef=0.1
    )
    old, ref = compress(columns[Col.OLD_LOG_PROBS]), compress(columns[Col.REF_LOG_PROBS])
    kl = [[k3(a, b) for a, b in zip(o, r)] for o, r in zip(old, ref)]
    rewards = [[s - 0.1 * k for s, k in zip(srow, krow)] for srow, krow in zip(expected_token_scores(), kl)]
    close(out[Col.TOKEN_LEVEL_REWARDS], scatter(rewards))
    zero_on_given(out[Col.TOKEN_LEVEL_REWARDS])
    assert metrics["kl/mean"] == pytest.approx(sum(sum(r) / len(r) for r in kl) / len(kl), abs=1e-6)


def test_reinforce_plus_plus_reward_to_go_runs_over_generated_tokens_across_tool_spans():
    out, _ = driver(tensors(), adv_estimator="reinforce_plus_plus", gamma=0.9)
    returns = [reward_to_go(row, 0.9) for row in expected_token_scores()]
    close(out[Col.RETURNS], scatter(returns))
    close(out[Col.ADVANTAGES], scatter(whiten(returns)))
    # not reset at the tool span: row 0's first turn gets the later turns' discounted rewards
    assert float(out[Col.RETURNS][0, 2]) == pytest.approx(0.1 + 0.9**2 * -0.2 + 0.9**5 * 1.3, abs=1e-6)
    zero_on_given(out[Col.RETURNS])
    zero_on_given(out[Col.ADVANTAGES])


def test_gae_bootstraps_from_the_next_generated_token_across_tool_spans():
    columns = tensors()
    out, _ = driver(
        columns, adv_estimator="gae", gamma=0.9, lam=0.8, use_kl_in_reward=True, kl_penalty="k1", kl_coef=0.05
    )
    values = compress(columns[Col.VALUES])
    kl = [
        [a - b for a, b in zip(o, r)]
        for o, r in zip(compress(columns[Col.OLD_LOG_PROBS]), compress(columns[Col.REF_LOG_PROBS]))
    ]
    rewards = [[s - 0.05 * k for s, k in zip(srow, krow)] for srow, krow in zip(expected_token_scores(), kl)]
    advantages = [gae_row(r, v, 0.9, 0.8) for r, v in zip(rewards, values)]
    returns = [[a + v for a, v in zip(arow, vrow)] for arow, vrow in zip(advantages, values)]
    close(out[Col.RETURNS], scatter(returns))
    close(out[Col.ADVANTAGES], scatter(whiten(advantages)))
    zero_on_given(out[Col.RETURNS])
    zero_on_given(out[Col.ADVANTAGES])


def test_remax_return_runs_over_generated_tokens_minus_the_greedy_baseline():
    columns = tensors()
    out, _ = driver(columns, adv_estimator="remax")
    returns = [reward_to_go(row, 1.0) for row in expected_token_scores()]
    baseline = columns[Col.BASELINE_SCORES].tolist()
    close(out[Col.RETURNS], scatter(returns))
    close(out[Col.ADVANTAGES], scatter([[g - b for g in row] for row, b in zip(returns, baseline)]))
    zero_on_given(out[Col.ADVANTAGES])


# ---------------------------------------------------------------------------------------------------------
# the actor's objective, the critic's loss


def objective(
    columns: dict[str, torch.Tensor], mode: str, mask: torch.Tensor = MASK, horizon: int = R, **algo
):
    """policy_objective (what ActorRole._policy_loss runs on the model's output) on one micro-batch that
    is the whole mini-batch: (loss, metrics, d loss / d log_probs)."""
    settings = AlgorithmConfig(loss_agg_mode=mode, **algo)
    log_probs = columns["log_probs"].double().clone().requires_grad_(True)
    mb = {"mask": mask, Col.ADVANTAGES: columns[Col.ADVANTAGES].double()}
    if settings.use_kl_loss:
        mb[Col.REF_LOG_PROBS] = columns[Col.REF_LOG_PROBS].double()
    rows_with_tokens = float((mask > 0).any(-1).sum())
    counts = GlobalCounts(float(mask.sum()), float(len(mask)), horizon, rows_with_tokens)
    loss, metrics = policy_objective(
        settings,
        log_probs,
        columns[Col.OLD_LOG_PROBS].double(),
        mb,
        counts,
        entropy=lambda: columns[Col.ENTROPY].double(),
        generator=torch.Generator().manual_seed(3) if settings.policy_loss == "clip_cov" else None,
    )
    loss.backward()
    assert log_probs.grad is not None
    return loss.detach(), {k: float(v) for k, v in metrics.items()}, log_probs.grad


@pytest.mark.parametrize("mode", AGG_MODES)
def test_policy_loss_kl_loss_and_entropy_see_generated_tokens_under_each_aggregation(mode):
    columns = tensors()
    loss, metrics, grad = objective(
        columns, mode, use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, clip_ratio_c=3.0
    )
    logp, old = compress(columns["log_probs"]), compress(columns[Col.OLD_LOG_PROBS])
    adv, ref = compress(columns[Col.ADVANTAGES]), compress(columns[Col.REF_LOG_PROBS])
    entropy = compress(columns[Col.ENTROPY])
    pg = agg([[ppo_token_loss(*t) for t in zip(*row)] for row in zip(logp, old, adv)], mode)
    kl = agg([[k3(a, b) for a, b in zip(*row)] for row in zip(logp, ref)], mode)
    assert metrics["actor/pg_loss"] == pytest.approx(pg, abs=1e-6)
    assert metrics["actor/kl_loss"] == pytest.approx(kl, abs=1e-6)
    assert metrics["actor/entropy"] == pytest.approx(agg(entropy, "token-mean"), abs=1e-6)
    assert float(loss) == pytest.approx(pg - 0.01 * agg(entropy, mode) + 0.1 * kl, abs=1e-6)
    ppo_kl = agg([[o - lp for lp, o in zip(*row)] for row in zip(logp, old)], "token-mean")
    assert metrics["actor/ppo_kl"] == pytest.approx(ppo_kl, abs=1e-6)
    zero_on_given(grad)  # no gradient reaches a given token


@pytest.mark.parametrize("loss_name", list(POLICY_LOSSES))
@pytest.mark.parametrize("mode", AGG_MODES)
def test_every_policy_loss_on_the_holey_rows_equals_it_on_the_rows_compressed(loss_name, mode):
    columns = tensors()
    holey_loss, holey_metrics, grad = objective(columns, mode, policy_loss=loss_name, use_kl_loss=True)
    dense = {}
    for name in ("log_probs", Col.OLD_LOG_PROBS, Col.ADVANTAGES, Col.REF_LOG_PROBS, Col.ENTROPY):
        dense[name], dense_mask = dense_batch(columns[name])
    dense_loss, dense_metrics, _ = objective(
        dense, mode, mask=dense_mask, policy_loss=loss_name, use_kl_loss=True
    )
    assert float(holey_loss) == pytest.approx(float(dense_loss), abs=1e-6)
    assert holey_metrics == pytest.approx(dense_metrics, abs=1e-6)
    zero_on_given(grad)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_value_loss_sees_generated_tokens_only(mode):
    from megarl.algorithms.value_loss import clipped_value_loss

    columns = tensors()
    values, old, returns = (columns[k].double() for k in ("new_values", Col.VALUES, Col.RETURNS))
    counts = GlobalCounts(float(MASK.sum()), float(len(MASK)), R, float(len(MASK)))
    loss, metrics = clipped_value_loss(values, old, returns, MASK, 0.2, agg_mode=mode, **counts.agg())
    rows = []
    for v_row, o_row, r_row in zip(compress(values), compress(old), compress(returns)):
        rows.append(
            [
                0.5 * max((v - r) ** 2, (o + min(max(v - o, -0.2), 0.2) - r) ** 2)
                for v, o, r in zip(v_row, o_row, r_row)
            ]
        )
    assert float(loss) == pytest.approx(agg(rows, mode), abs=1e-6)
    assert float(metrics["vpred_mean"]) == pytest.approx(agg(compress(values), "token-mean"), abs=1e-6)


# ---------------------------------------------------------------------------------------------------------
# the step's metrics and the reward's length


class _Actor:
    """Stands in for the actor group: hands back the log_prob pass's columns (the worker computes them
    0 at given tokens; here they hold other values there, which the stage must not read)."""

    def __init__(self, columns: dict[str, torch.Tensor]) -> None:
        self.columns = columns

    def log_prob(self, batch: Batch) -> Batch:
        return Batch({k: self.columns[k] for k in (Col.OLD_LOG_PROBS, Col.ENTROPY)})


def test_entropy_and_mismatch_metrics_of_the_old_log_prob_stage_see_generated_tokens():
    columns = tensors()
    stage = old_log_prob_stage(_Actor(columns), with_rollout=True)
    batch = rollout(columns)
    batch[Col.ROLLOUT_LOG_PROBS] = columns[Col.ROLLOUT_LOG_PROBS]
    ctx = StepContext(step=1)
    stage.run(ctx, batch)
    diffs = [
        [r - o for r, o in zip(*row)]
        for row in zip(compress(columns[Col.ROLLOUT_LOG_PROBS]), compress(columns[Col.OLD_LOG_PROBS]))
    ]
    assert ctx.metrics["actor/entropy"] == pytest.approx(
        agg(compress(columns[Col.ENTROPY]), "token-mean"), abs=1e-6
    )
    assert ctx.metrics["mismatch_kl"] == pytest.approx(agg(diffs, "token-mean"), abs=1e-6)
    assert ctx.metrics["train_rollout_logprob_abs_diff_max"] == pytest.approx(
        max(abs(d) for row in diffs for d in row), abs=1e-6
    )


def test_response_length_metrics_count_generated_tokens():
    columns = tensors()
    batch = rollout(columns)
    batch[Col.ADVANTAGES] = columns[Col.ADVANTAGES]
    metrics = batch_statistics(batch)
    lengths = [len(g) for g in GENERATED]  # 8, 6, 6, 3; attention_mask would give 11, 9, 6, 7
    assert metrics["response_length/mean"] == pytest.approx(sum(lengths) / len(lengths))
    assert metrics["response_length/max"] == max(lengths)
    assert metrics["response_length/clip_ratio"] == pytest.approx(FINISH.count("length") / len(FINISH))
    abs_adv = [[abs(a) for a in row] for row in compress(columns[Col.ADVANTAGES])]
    assert metrics["advantages/abs_mean"] == pytest.approx(agg(abs_adv, "token-mean"), abs=1e-6)


def test_dapo_overlong_penalty_counts_generated_tokens():
    reward = RewardModelConfig(
        weights={"function": 0.0},
        overlong_buffer=OverlongBufferConfig(enable=True, len=6, penalty_factor=1.0),
    )
    computer = RewardComputer(reward, tokenizer=None, max_response_length=R)
    try:
        assert set(computer.reads(False)) == {Col.RESPONSES, Col.RESPONSE_MASK}
        penalty, metrics = computer.score(rollout(tensors()))
    finally:
        computer.close()
    expected = [min(0.0, -(len(g) - (R - 6)) / 6 * 1.0) for g in GENERATED]
    close(penalty, torch.tensor(expected))
    # row 0: 8 generated tokens, 2 into the buffer; counting its 3 given tokens too would give -5/6, and
    # rows 1 and 3 (9 and 7 attended tokens) would be penalised as well
    assert expected == pytest.approx([-1 / 3, 0.0, 0.0, 0.0])
    assert metrics["reward/overlong/frac"] == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------------------
# what sits at given tokens changes nothing


def test_values_at_given_tokens_change_nothing():
    columns, other = tensors(), with_given(tensors(), seed=11)
    assert not torch.equal(columns[Col.OLD_LOG_PROBS], other[Col.OLD_LOG_PROBS])
    for estimator in ("gae", "reinforce_plus_plus", "remax"):
        settings = {"adv_estimator": estimator, "gamma": 0.9, "lam": 0.8, "use_kl_in_reward": True}
        (a, ma), (b, mb) = driver(columns, **settings), driver(other, **settings)
        for name in (Col.TOKEN_LEVEL_REWARDS, Col.ADVANTAGES, Col.RETURNS):
            close(a[name], b[name])
        assert ma == pytest.approx(mb, abs=1e-6)
    for mode in AGG_MODES:
        settings = {"use_kl_loss": True, "entropy_coeff": 0.01}
        (la, ma, ga), (lb, mb, gb) = objective(columns, mode, **settings), objective(other, mode, **settings)
        assert float(la) == pytest.approx(float(lb), abs=1e-6) and ma == pytest.approx(mb, abs=1e-6)
        close(ga, gb)
    # the rewards: a value at a given token of token_level_scores does not reach the estimators' outputs
    batch = scored(columns)
    noisy = torch.where(GIVEN, torch.full_like(MASK, 7.0), batch[Col.TOKEN_LEVEL_SCORES])
    for estimator in ("gae", "reinforce_plus_plus", "remax"):
        cfg = MegarlConfig()
        cfg.algorithm.adv_estimator, cfg.algorithm.gamma, cfg.algorithm.lam = estimator, 0.9, 0.8
        stage, _ = advantages_stage(cfg)
        outs = []
        for scores in (batch[Col.TOKEN_LEVEL_SCORES], noisy):
            b = scored(columns)
            b[Col.TOKEN_LEVEL_SCORES], b[Col.VALUES] = scores, other[Col.VALUES]
            outs.append(stage.run(StepContext(step=1), b))
        close(outs[0][Col.ADVANTAGES], outs[1][Col.ADVANTAGES])
        close(outs[0][Col.RETURNS], outs[1][Col.RETURNS])
    stage_a, stage_b = old_log_prob_stage(_Actor(columns)), old_log_prob_stage(_Actor(other))
    ctx_a, ctx_b = StepContext(step=1), StepContext(step=1)
    stage_a.run(ctx_a, rollout(columns))
    stage_b.run(ctx_b, rollout(other))
    assert ctx_a.metrics["actor/entropy"] == pytest.approx(ctx_b.metrics["actor/entropy"], abs=1e-6)
