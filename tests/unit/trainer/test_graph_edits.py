"""A user's edit of the RL graph reaches what trains, or is refused when it is made: the README's
`length_bonus` after the reward changes the advantages the update gets (by the numbers), the same stage
after the advantages is refused naming both stages, and every config's own graph passes the check."""

from __future__ import annotations

import itertools
import typing
from types import SimpleNamespace

import pytest
import torch

from megarl.config import ConfigError, load_config
from megarl.config.options import AdvEstimator
from megarl.protocol import Batch
from megarl.rewards import RewardComputer
from megarl.trainer.dataflow import DataflowError, Stage, StepContext
from megarl.trainer.rl_stages import build_rl_dataflow
from megarl.trainer.roles import enabled_roles
from megarl.trainer.scoring import scoring_stages

EXACT_MATCH = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)
"""
# 2 prompts x 2 samples: the first group's task scores differ (1, 0), the second's are equal (1, 1), so
# GRPO teaches nothing from it, until the length bonus separates them
TEXTS, TRUTHS, LENGTHS, UIDS = ["7", "3", "12", "12"], ["7", "7", "12", "12"], [3, 5, 2, 4], [0, 0, 1, 1]
R = 6  # response width


def length_bonus(ctx: StepContext, batch: Batch) -> dict:
    """The README's example: 0.01 per response token on top of the task's score."""
    return {"scores": batch["scores"] + 0.01 * batch["response_mask"].sum(-1)}


BONUS = Stage("length_bonus", length_bonus, reads=("scores", "response_mask"), writes=("scores",))


def _rollout(rows: slice = slice(None)) -> Batch:
    """What generate returns: the rollout columns plus the prompt batch's, carried to each sample."""
    n = len(TEXTS)
    mask = torch.tensor([[1.0] * k + [0.0] * (R - k) for k in LENGTHS])
    prompts = torch.ones(n, 2, dtype=torch.long)
    responses = torch.arange(n * R).reshape(n, R) % 50
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], 1),
        "attention_mask": torch.cat([torch.ones(n, 2, dtype=torch.long), mask.long()], 1),
        "response_mask": mask,
        "uid": torch.tensor(UIDS),
    }
    columns = {
        "finish_reason": ["stop"] * n,
        "response_text": TEXTS,  # the reward reads it instead of decoding the tokens
        "data_source": ["digits"] * n,
        "ground_truth": TRUTHS,
        "extra_info": [{}] * n,
    }
    return Batch(tensors, columns)[rows]


class Actor:
    """The actor group as the graph sees it: generate returns the rollout, update keeps what it trains on."""

    def __init__(self) -> None:
        self.trained: Batch | None = None

    def generate(self, prompts: Batch, validate: bool = False) -> Batch:
        return _rollout(slice(0, 4, 2) if validate else slice(None))  # greedy: one response per prompt

    def update(self, batch: Batch) -> dict:
        self.trained = batch
        return {"pg_loss": 0.0}


def _fake_roles(cfg) -> SimpleNamespace:
    """A stand-in handle for each role the config enables (building the graph calls no method)."""
    present = enabled_roles(cfg)
    names = {"ref": "ref", "critic": "critic", "reward_model": "reward"}
    return SimpleNamespace(
        actor=object(), **{n: object() if r in present else None for n, r in names.items()}
    )


def _graph(tmp_path, *overrides: str, actor=None):
    path = tmp_path / "exact_match.py"
    path.write_text(EXACT_MATCH)
    cfg = load_config(
        None,
        [
            "algorithm.name=grpo",
            "rollout.n=2",
            "data.train_batch_size=2",
            "algorithm.ppo_mini_batch_size=2",
            "rollout.calculate_log_probs=false",
            f"reward.function.path={path}",
            *overrides,
        ],
        check_paths=False,
    )
    roles = _fake_roles(cfg)
    roles.actor = actor or Actor()
    flow, _ = build_rl_dataflow(cfg, roles, RewardComputer.from_config(cfg, None))
    return flow, roles.actor


def _step(flow) -> StepContext:
    ctx = StepContext(step=1)
    prompts = Batch({"prompts": torch.ones(2, 2, dtype=torch.long), "attention_mask": torch.ones(2, 2)})
    flow.run(prompts, ctx)
    return ctx


def _grpo_by_hand(scores: list[float] | torch.Tensor) -> torch.Tensor:
    """GRPO's advantages of the rollout's rows: each group's (score - mean) / (std + 1e-6), on the
    response tokens."""
    s = torch.as_tensor(scores)
    adv = torch.zeros(len(scores))
    for group in set(UIDS):
        rows = torch.tensor([u == group for u in UIDS])
        adv[rows] = (s[rows] - s[rows].mean()) / (s[rows].std() + 1e-6)
    mask = torch.tensor([[1.0] * k + [0.0] * (R - k) for k in LENGTHS])
    return adv[:, None] * mask


def test_a_stage_rewriting_scores_after_the_reward_changes_what_the_update_trains_on(tmp_path):
    flow, actor = _graph(tmp_path)
    assert flow.names == ["generate", "reward", "token_rewards", "advantages", "update_actor"]
    _step(flow)
    task = [1.0, 0.0, 1.0, 1.0]
    assert torch.allclose(actor.trained["advantages"], _grpo_by_hand(task))
    assert actor.trained["advantages"][2:].abs().sum() == 0  # equal task scores: nothing to learn

    flow.insert_after("reward", BONUS)  # the README's edit
    assert flow.names == ["generate", "reward", "length_bonus", "token_rewards", "advantages", "update_actor"]
    ctx = _step(flow)
    with_bonus = torch.tensor(task) + 0.01 * torch.tensor(LENGTHS).float()  # 1.03, 0.05, 1.02, 1.04
    assert torch.allclose(actor.trained["advantages"], _grpo_by_hand(with_bonus))
    assert actor.trained["advantages"][3, 0] > 0 > actor.trained["advantages"][2, 0]  # the longer wins
    assert ctx.metrics["reward/mean"] == pytest.approx(0.75)  # the reward stage's own terms, logged
    # validation, ReMax's baseline and DAPO's extra batches score with the flow's scoring stages
    assert [s.name for s in scoring_stages(flow)] == ["reward", "length_bonus"]


def test_remax_scores_its_greedy_baseline_with_the_inserted_stage_too(tmp_path):
    flow, _ = _graph(tmp_path, "algorithm.name=ppo", "algorithm.adv_estimator=remax", "rollout.val.n=1")
    flow.insert_after("reward", BONUS)
    prompts = Batch({"prompts": torch.ones(2, 2, dtype=torch.long), "attention_mask": torch.ones(2, 2)})
    out = flow["remax_baseline"].run(StepContext(step=1), prompts)
    assert out["baseline_scores"].tolist() == pytest.approx([1.0 + 0.03, 1.0 + 0.02])  # rows 0 and 2


@pytest.mark.parametrize(
    ("after", "reader", "via"),
    [
        ("advantages", "update_actor", "'advantages', which follows from 'token_level_scores'"),
        ("token_rewards", "advantages", "'token_level_scores'"),
    ],
)
def test_a_stage_rewriting_scores_after_token_rewards_is_refused_naming_both_stages(
    tmp_path, after, reader, via
):
    flow, _ = _graph(tmp_path)
    names = flow.names
    late = Stage("late_bonus", length_bonus, reads=("scores", "response_mask"), writes=("scores",))
    with pytest.raises(DataflowError) as refused:
        flow.insert_after(after, late)
    assert str(refused.value).startswith(
        f"stage 'late_bonus' rewrites column 'scores' after stage 'token_rewards' derived 'token_level_scores' "
        f"from it, and stage {reader!r} reads {via}: the rewrite would not reach {reader!r}. Insert "
        "'late_bonus' before 'token_rewards'"
    )
    assert flow.names == names


def test_a_weighted_reward_column_is_a_declared_input_its_stage_must_precede(tmp_path):
    flow, actor = _graph(tmp_path, "reward.weights.length=0.01")
    assert "length" in flow["reward"].reads
    length = Stage(
        "length", lambda ctx, b: {"length": b["response_mask"].sum(-1)}, ("response_mask",), ("length",)
    )
    flow.insert_after("reward", length)
    with pytest.raises(
        DataflowError, match=r"'reward' reads column 'length'.*'length' writes it but runs later"
    ):
        flow.check()
    flow.remove("length").insert_before("reward", length)
    _step(flow)
    with_bonus = torch.tensor([1.0, 0.0, 1.0, 1.0]) + 0.01 * torch.tensor(LENGTHS).float()  # as length_bonus
    assert torch.allclose(actor.trained["advantages"], _grpo_by_hand(with_bonus))


def test_the_reward_stage_declares_what_the_reward_reads(tmp_path):
    flow, _ = _graph(tmp_path)
    assert set(flow["reward"].reads) == {
        "responses",
        "response_mask",
        "data_source",
        "ground_truth",
        "extra_info",
    }
    rm_only, _ = _graph(tmp_path, "reward.weights.function=0", "reward.model_path=/rm")
    assert rm_only["reward"].reads == ("rm_scores",)


ESTIMATORS = typing.get_args(AdvEstimator)
ROLLOUT_CORRECTION = [
    [],
    ["algorithm.rollout_correction.rollout_is=token"],
    [
        "algorithm.rollout_correction.rollout_rs=sequence",  # rejection rewrites response_mask
        "algorithm.rollout_correction.rollout_rs_threshold=2.0",
        "algorithm.rollout_correction.rollout_token_veto_threshold=1e-4",
    ],
    ["algorithm.rollout_correction.bypass_mode=true", "algorithm.policy_loss=reinforce"],
]
EXTRAS = [  # the other options that add stages or columns, alone and together
    [],
    ["algorithm.use_kl_in_reward=true"],
    ["data.train_batch_size=16", "algorithm.ppo_mini_batch_size=16"],  # old_log_prob fused when allowed
    [
        "algorithm.use_kl_loss=true",
        "algorithm.filter_groups.enable=true",
        "algorithm.pf_ppo.enable=true",
        "reward.model_path=/rm",
        "trainer.n_devices_per_node=2",  # balance_batch
    ],
]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_config_builds_a_graph_the_check_accepts(estimator):
    """Each estimator with rollout correction's modes and the options that add or rewrite stages: nothing
    a config asks for is refused (generate's and rollout rejection's rewrites are declared refinements)."""
    base = [f"algorithm.adv_estimator={estimator}", "rollout.n=4", "rollout.val.n=1"]
    base += ["algorithm.name=grpo"] if estimator in ("grpo", "drgrpo") else ["algorithm.name=ppo"]
    built = []
    for correction, extra in itertools.product(ROLLOUT_CORRECTION, EXTRAS):
        try:
            cfg = load_config(None, [*base, *correction, *extra], check_paths=False)
        except ConfigError:
            continue  # a combination the config refuses on its own, naming the keys
        flow, _ = build_rl_dataflow(
            cfg, _fake_roles(cfg), RewardComputer.from_config(cfg, None), lambda: None
        )
        flow.check()
        built.append(flow)
    assert len(built) >= 12, [f.names for f in built]
    assert any("response_mask" in f["rollout_correction"].writes for f in built if "rollout_correction" in f)


@pytest.mark.parametrize("config", ["configs/quickstart_grpo.yaml", "configs/ppo_llama_8b.yaml"])
def test_the_repos_rl_configs_build_a_graph_the_check_accepts(config):
    cfg = load_config(config, [], check_paths=False)
    flow, _ = build_rl_dataflow(cfg, _fake_roles(cfg), RewardComputer.from_config(cfg, None), lambda: None)
    assert "token_rewards" in flow.names
