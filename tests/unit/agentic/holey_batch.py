"""The hand-built multi-turn batch of test_masks (responses with given tokens inside) and the
reference computations on its rows compressed to their generated tokens."""

from __future__ import annotations

import math

import torch

from megarl.config.schema import MegarlConfig
from megarl.protocol import Batch, Col
from megarl.trainer.dataflow import StepContext
from megarl.trainer.rl_stages import advantages_stage
from megarl.trainer.scoring import token_rewards_stage

R = 12
# 1 generated, 0 given (tool output / user turn / template boundary), . padding (attention_mask 0)
ROWS = [
    "11100110111.",  # two tool spans between three turns, then padding
    "111100011...",  # a trailing tool span, then a final generated turn
    "111111......",  # a single turn
    "1110000.....",  # the budget ran out inside a tool output: the response ends with given tokens
]
MASK = torch.tensor([[1.0 if c == "1" else 0.0 for c in row] for row in ROWS])
ATTENDED = torch.tensor([[0 if c == "." else 1 for c in row] for row in ROWS])
GIVEN = (MASK == 0) & (ATTENDED == 1)
GENERATED = [[t for t, c in enumerate(row) if c == "1"] for row in ROWS]
SCORES = torch.tensor([1.0, 0.0, 0.5, -1.0])
TURN_ENDS = [[2, 6, 10], [3, 8], [5], [2]]  # each turn's last generated token
TURN_SCORES = [[0.1, -0.2, 0.3], [0.5, 0.0], [0.0], [0.25]]
FINISH = ["stop", "stop", "length", "length"]
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
TOL = {"atol": 1e-6, "rtol": 0.0}


# ---------------------------------------------------------------------------------------------------------
# compression: the rows as dense generated-token sequences, and back


def compress(x: torch.Tensor) -> list[list[float]]:
    """Each row's values at its generated tokens, in order (python floats in double precision)."""
    return [[float(x[i, t]) for t in GENERATED[i]] for i in range(len(ROWS))]


def scatter(rows: list[list[float]]) -> torch.Tensor:
    """Dense per-generated-token values back to [n, R] float64, 0 at given tokens and padding."""
    out = torch.zeros(len(ROWS), R, dtype=torch.float64)
    for i, values in enumerate(rows):
        for t, v in zip(GENERATED[i], values):
            out[i, t] = v
    return out


def dense_batch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows compressed as a right-padded tensor [n, G] and its mask (what a single-turn batch of the
    same generated tokens would look like)."""
    width = max(len(g) for g in GENERATED)
    out, mask = torch.zeros(len(ROWS), width, dtype=x.dtype), torch.zeros(len(ROWS), width)
    for i, g in enumerate(GENERATED):
        out[i, : len(g)], mask[i, : len(g)] = x[i, g], 1.0
    return out, mask


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.double(), expected.double(), **TOL)


def zero_on_given(x: torch.Tensor) -> None:
    assert torch.equal(x[MASK == 0], torch.zeros_like(x[MASK == 0])), "a value on a given token or padding"


# ---------------------------------------------------------------------------------------------------------
# definitions on dense sequences (lists of floats), written independently of megarl


def k3(logp: float, ref: float) -> float:
    r = max(min(ref - logp, 20.0), -20.0)
    return max(min(math.exp(r) - r - 1, 10.0), -10.0)


def reward_to_go(rewards: list[float], gamma: float) -> list[float]:
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def gae_row(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(values) else 0.0
        running = rewards[t] + gamma * next_value - values[t] + gamma * lam * running
        out[t] = running
    return out


def whiten(rows: list[list[float]]) -> list[list[float]]:
    flat = [v for row in rows for v in row]
    mean = sum(flat) / len(flat)
    var = sum((v - mean) ** 2 for v in flat) / (len(flat) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in rows]


def agg(rows: list[list[float]], mode: str, horizon: int = R) -> float:
    """The loss aggregation modes from their definitions (every row here has generated tokens)."""
    if mode == "token-mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq-mean-token-sum":
        return sum(map(sum, rows)) / len(rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    return sum(map(sum, rows)) / (len(rows) * horizon)  # Dr.GRPO: a constant horizon (R, the columns)


def ppo_token_loss(logp: float, old: float, adv: float, low=0.2, high=0.2, dual=3.0) -> float:
    ratio = math.exp(logp - old)
    loss = max(-adv * ratio, -adv * min(max(ratio, 1 - low), 1 + high))
    return min(loss, -adv * dual) if adv < 0 else loss


# ---------------------------------------------------------------------------------------------------------
# the batch


def tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """Per-token columns with values everywhere (also at given tokens, as a model would produce there)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return torch.randn(len(ROWS), R, generator=gen) * scale + shift

    turn_rewards = torch.zeros(len(ROWS), R)
    for i, (ends, scores) in enumerate(zip(TURN_ENDS, TURN_SCORES)):
        for t, s in zip(ends, scores):
            turn_rewards[i, t] = s
    return {
        Col.OLD_LOG_PROBS: rand(0.5, -1.5),
        Col.REF_LOG_PROBS: rand(0.5, -1.5),
        Col.ROLLOUT_LOG_PROBS: rand(0.5, -1.5),
        "log_probs": rand(0.5, -1.5),
        Col.ENTROPY: rand(0.3, 1.0).abs(),
        Col.VALUES: rand(0.5),
        Col.ADVANTAGES: rand(),
        Col.RETURNS: rand(),
        "new_values": rand(0.5),
        Col.BASELINE_SCORES: torch.tensor([0.5, 0.5, -0.25, -0.25]),
        Col.TURN_REWARDS: turn_rewards,
    }


def with_given(columns: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """The same columns with other values at every masked-out position (given tokens and padding)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, value in columns.items():
        if value.shape == MASK.shape and name != Col.TURN_REWARDS:
            noise = torch.randn(value.shape, generator=gen) * 5 - 2
            value = torch.where(MASK > 0, value, noise.abs() if name == Col.ENTROPY else noise)
        out[name] = value
    return out


def rollout(columns: dict[str, torch.Tensor]) -> Batch:
    """The rollout batch the scoring and driver stages see."""
    responses = torch.where(ATTENDED > 0, torch.arange(R) + 10, 0)
    prompts = torch.full((len(ROWS), 2), 5)
    return Batch(
        {
            Col.PROMPTS: prompts,
            Col.RESPONSES: responses,
            Col.INPUT_IDS: torch.cat([prompts, responses], 1),
            Col.ATTENTION_MASK: torch.cat([torch.ones(len(ROWS), 2, dtype=torch.long), ATTENDED], 1),
            Col.RESPONSE_MASK: MASK,
            Col.UID: torch.tensor([0, 0, 1, 1]),
            Col.SCORES: SCORES,
            **{k: columns[k] for k in (Col.TURN_REWARDS, Col.BASELINE_SCORES)},
        },
        {Col.FINISH_REASON: FINISH},
    )


def scored(columns: dict[str, torch.Tensor]) -> Batch:
    """The rollout after the token_rewards stage the trainer builds for a multi-turn generate stage."""
    batch = rollout(columns)
    return token_rewards_stage(turn_rewards=True).run(StepContext(step=1), batch)


def driver(columns: dict[str, torch.Tensor], **algorithm) -> tuple[Batch, dict[str, float]]:
    """The advantages stage (in-reward KL, estimator) on the scored rollout with the workers' columns."""
    cfg = MegarlConfig()
    for key, value in algorithm.items():
        setattr(cfg.algorithm, key, value)
    stage, _ = advantages_stage(cfg)
    batch = scored(columns)
    for name in (Col.OLD_LOG_PROBS, Col.REF_LOG_PROBS, Col.VALUES):
        batch[name] = columns[name]
    ctx = StepContext(step=1)
    return stage.run(ctx, batch), ctx.metrics


def expected_token_scores() -> list[list[float]]:
    """Each turn's score on its last generated token, the sequence's score added on the last one."""
    rows = compress(tensors()[Col.TURN_REWARDS])
    for i, row in enumerate(rows):
        row[-1] += float(SCORES[i])
    return rows


# ---------------------------------------------------------------------------------------------------------
# where rewards land
