"""The Python API as users meet it: the README's two examples run from the README text itself and every
script in examples/ runs, each in a smaller setting, asserting what it shows.

The examples find the quickstart task through `megarl.quickstart.prepare("outputs/examples/task")`,
which reuses what is there: the tests run in a temporary directory where that path holds the session's
SFT'd model and data (tests/e2e/conftest.py), so nothing is trained twice.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from statistics import mean

import pytest
import torch

from tests.helpers.rl_runs import assert_same_metrics

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# a small step (8 prompts × 4 samples, no validation) for runs that show what happens, not learning
SMALL = {
    "data.train_batch_size": 8,
    "algorithm.ppo_mini_batch_size": 8,
    "rollout.n": 4,
    "actor.micro_batch_size": 8,
    "ref.micro_batch_size": 8,
    "trainer.val_before_train": False,
    "trainer.eval_every": 0,
    "logging.report": False,
    "trainer.save_every": -1,
}


@pytest.fixture
def workdir(rl_setup, tmp_path, monkeypatch):
    """A directory whose outputs/examples/task is the session's quickstart task (see the module doc)."""
    task = tmp_path / "outputs" / "examples" / "task"
    (task / "models").mkdir(parents=True)
    (task / "models" / "llama").symlink_to(rl_setup.base_model)
    (task / "sft").symlink_to(rl_setup.sft_model.parent)
    (task / "data").symlink_to(rl_setup.data)
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    return tmp_path


def example(name: str):
    return importlib.import_module(name)


def readme_block(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    found = re.search(rf"<!-- readme-example: {marker} -->\n```python\n(.*?)```", text, re.S)
    assert found, f"README.md has no python block after <!-- readme-example: {marker} -->"
    return found.group(1)


def small_readme(code: str, steps: int, settings: str = "SMALL") -> str:
    """The README's code with fewer steps and the test's settings (the only substitutions)."""
    small = code.replace('"trainer.total_steps": 10', f'"trainer.total_steps": {steps}, **{settings}')
    small = small.replace(
        'task_config(task, "outputs/api_flow")', f'task_config(task, "outputs/api_flow", **{settings})'
    )
    small = small.replace("flow.run(steps=4)", f"flow.run(steps={steps})")
    assert small.count(settings) == 1, "the README's example changed: update the substitutions here"
    return small


# The README's PPO run in CI as the README has it (10 steps of 16 prompts × 8 samples, validated before and
# after), plus verl's adaptive KL-in-reward controller and a checkpoint at step 9 that a second run of the
# same text resumes (actor, critic, KL controller, data position and RNG restored; its one step, the last,
# equal to the uninterrupted run's shows that: a step more would show the same equality again). The sampled training
# reward spreads ±0.1 from step to step (seen 0.47 at step 1, 0.39-0.68 after): the greedy val reward is
# what shows the rise.
PPO_STEPS, PPO_SAVE = 10, 9
PPO_CI = {
    "algorithm.use_kl_loss": False,
    "algorithm.use_kl_in_reward": True,
    "algorithm.kl_ctrl": "adaptive",
    "trainer.save_every": PPO_SAVE,
    "logging.report": False,
}


def test_the_readmes_ppo_example_learns_and_a_rerun_of_its_text_resumes_exactly(workdir):
    code = readme_block("ppo")
    assert code in (REPO / "examples" / "ppo_simple.py").read_text()  # the example IS the README's text
    scope = {"PPO_CI": PPO_CI}
    exec(compile(small_readme(code, PPO_STEPS, "PPO_CI"), "README.md[ppo]", "exec"), scope)
    history = scope["history"]
    train = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in train] == list(range(1, PPO_STEPS + 1))
    assert scope["first"] == {k: v for k, v in train[0].items() if k != "step"}
    assert not scope["actor"].started and not scope["critic"].started  # close() stopped them
    for h in train:
        assert {"critic/value_loss", "actor/pg_loss", "kl/mean", "kl/coef", "timing/values"} <= set(h)
        assert h["reward/mean"] == h["reward/exact/mean"]  # one term, weight 1
    val = scope["val"]  # what the README prints: greedy on the same 64 prompts, before and after
    assert len(val) == 2 and val[1] > val[0] + 0.1, val  # seen 0.55 -> 0.72
    # the critic learns: its loss against what predicting 0 would cost (½·E[R²] = ½·mean of the 0/1
    # reward) falls; the loss itself follows the reward's variance (0.14 -> 0.15 on one AMD EPYC as the
    # mean reward rose 0.31 -> 0.48, relative 0.89 -> 0.63)
    relative = [h["critic/value_loss"] / (0.5 * h["reward/mean"]) for h in train]
    assert relative[-1] < relative[0], relative
    checkpoints = workdir / "outputs" / "ppo" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step_10", f"step_{PPO_SAVE}"]
    assert sorted(p.name for p in (checkpoints / f"step_{PPO_SAVE}").iterdir() if p.is_dir()) == [
        "actor",
        "critic",
    ]

    # the same text again, resumed from step 9: step 10 (and its validation) equals the uninterrupted run's,
    # bit for bit
    resume = {
        **PPO_CI,
        "trainer.resume": str(checkpoints / f"step_{PPO_SAVE}"),
        "trainer.val_before_train": False,
    }
    rerun = small_readme(code, PPO_STEPS, "PPO_CI").replace('"outputs/ppo"', '"outputs/ppo_resumed"')
    scope = {"PPO_CI": resume}
    exec(compile(rerun, "README.md[ppo, resumed]", "exec"), scope)
    resumed = [scope["first"], *(h for h in scope["history"] if h["step"] > PPO_SAVE + 1)]
    assert [h["step"] for h in scope["history"] if h["step"] > PPO_SAVE] == list(
        range(PPO_SAVE + 1, PPO_STEPS + 1)
    )
    for expected, actual in zip(train[PPO_SAVE:], resumed):
        compared = assert_same_metrics(expected, actual)
        assert {"critic/value_loss", "actor/pg_loss", "kl/coef", "reward/mean"} <= set(compared)


def test_the_readmes_flow_rewiring_runs_from_its_text(workdir, capsys):
    scope = {"SMALL": SMALL}
    exec(compile(small_readme(readme_block("flow"), steps=2), "README.md[flow]", "exec"), scope)
    history, flow = scope["history"], scope["flow"]
    assert [h["step"] for h in history] == [1, 2]
    names = flow.names
    assert names.index("generate") < names.index("short") < names.index("reward") < names.index("clip")
    for h in history:  # the weighted sum, clipped at 1 by the user's stage after it
        assert h["reward/mean"] <= 1.0
        assert h["reward/exact/mean"] >= 0 and "reward/short/mean" in h
    assert "clip: scores -> scores" in capsys.readouterr().out


def test_grpo_curriculum_switches_the_reward_at_the_step_it_says(workdir):
    history = example("grpo_curriculum").main(steps=3, switch=2, **SMALL)
    terms = [sorted(k for k in h if k in ("reward/partial/mean", "reward/exact/mean")) for h in history]
    assert terms == [["reward/partial/mean"], ["reward/exact/mean"], ["reward/exact/mean"]]
    for h in history:
        term = h.get("reward/partial/mean", h.get("reward/exact/mean"))
        assert h["reward/mean"] == pytest.approx(term, abs=1e-6)


def test_multi_objective_sums_the_terms_with_the_weights_set_for_each_step(workdir):
    mod = example("multi_objective")
    history = mod.main(steps=3, reweigh=3, **SMALL)
    for h in history:
        w = mod.WEIGHTS[0] if h["step"] < 3 else mod.WEIGHTS[1]
        expected = w["exact"] * h["reward/exact/mean"] + w["brevity"] * h["reward/brevity/mean"]
        assert h["reward/mean"] == pytest.approx(expected, abs=1e-6), h["step"]
    assert any(h["reward/brevity/mean"] > 0 for h in history)  # the weight change is visible in the sum


def test_an_in_memory_model_and_a_torch_adamw_train_exactly_as_the_path_and_the_config(workdir):
    runs = example("hf_model").main(steps=2, **SMALL)
    (object_history, object_lps), (path_history, path_lps) = runs["in_memory"], runs["from_path"]
    assert len(object_lps) == len(path_lps) == 2
    # step 1: the same weights reached the ranks; step 2: the AdamW instance made the config's update
    for step, (a, b) in enumerate(zip(object_lps, path_lps), start=1):
        assert torch.equal(a, b), f"step {step}: engine log-probs differ by {float((a - b).abs().max())}"
    for a, b in zip(object_history, path_history):
        assert_same_metrics(b, a)


PPO_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "reward/mean")
PREFERENCE_KEYS = (
    "preference/loss",
    "preference/weighted_loss",
    "preference/rewards/accuracy",
    "preference/rewards/margin",
    "preference/logps/chosen",
    "preference/grad_norm",
    "timing/preference_update",
)


def test_dpo_ppo_makes_a_grpo_and_a_half_weighted_dpo_update_every_step(workdir):
    """The pairs' margin (the correct reversal over the copied digits) grows as the DPO updates train;
    the resume of the pairs' position is checked without workers (tests/unit/trainer/test_preference_stage.py)."""
    steps, pairs = 6, 16
    run = example("dpo_ppo").main(steps=steps, weight=0.5, pairs=pairs, **SMALL)
    history = run["history"]
    assert run["stages"][-2:] == ["update_actor", "preference_update"]
    position = run["state"]["stages"]["preference_update"]["pairs"]
    assert position["epoch"] == 0 and position["position"] == steps * pairs  # what a checkpoint keeps
    assert [h["step"] for h in history] == list(range(1, steps + 1))
    for h in history:
        assert all(key in h for key in PPO_KEYS + PREFERENCE_KEYS), h["step"]
        # the worker sums the backpropagated loss and the preference loss apart: their ratio is the weight
        assert h["preference/weighted_loss"] == pytest.approx(0.5 * h["preference/loss"], rel=1e-9)
        assert h["preference/bad_updates"] == 0 and h["preference/grad_norm"] > 0
    # each step's pairs are new ones: compare the first three steps with the last three (one step's 16
    # pairs spread: seen 0.07–0.23 in the first three, 0.72–0.92 in the last three)
    first, last = history[:3], history[3:]
    for key, rise in (("preference/rewards/margin", 0.2), ("preference/rewards/accuracy", 0.05)):
        assert mean(h[key] for h in last) > mean(h[key] for h in first) + rise, [h[key] for h in history]
    assert mean(h["preference/loss"] for h in last) < mean(h["preference/loss"] for h in first)


def test_device_map_places_each_role_apart_or_together_with_the_same_step_one_metrics(workdir):
    """Every rank runs with one thread and the same layout (TP1 × DP1 per role) on the same weights (the
    critic's fresh value head drawn from trainer.seed), on the same micro-batches: the same operations in
    the same order wherever a role's process runs, so the metrics are compared exactly."""
    mod = example("device_map")
    small = {**SMALL, "critic.micro_batch_size": 8}
    separate = mod.main(steps=1, colocated=False, **small)
    colocated = mod.main(steps=1, colocated=True, **small)
    pids = separate["pids"]  # four roles, four processes: the reference left the actor's
    assert len({pid for role in pids.values() for pid in role}) == 4, pids
    assert colocated["pids"]["reference"] == colocated["pids"]["actor"]  # in the actor's processes
    expected, actual = colocated["history"][0], separate["history"][0]
    compared = assert_same_metrics(expected, actual)
    keys = {"critic/value_loss", "actor/pg_loss", "actor/kl_loss", "reward/mean", "reward/reward_model/mean"}
    assert keys <= set(compared)
    # before its first update the policy is the reference: a KL of exactly 0 says the reference's own group
    # gave the log-probs the actor's processes give, bit for bit
    assert actual["actor/kl_loss"] == 0.0
    logs = sorted(p.name for p in (workdir / "outputs/examples/device_map/separate/logs").iterdir())
    assert logs == ["actor_rank0.log", "critic_rank0.log", "ref_rank0.log", "reward_rank0.log"]


def test_reward_model_learns_to_rank_held_out_pairs_and_grpo_against_it_raises_its_score(workdir):
    """The RM: 40 steps of 32 pairs (seen 0.48 -> 0.91 held-out accuracy). GRPO: 32 prompts × 8 samples
    a step, the RM's score alone (seen: greedy val score 0.09 -> 1.18 after 10 steps; the training
    batches' mean 0.52 over the first 3 steps, 1.18 over the last 3, step-to-step spread ≈ 0.3; 16
    prompts × 4 samples were too few for a clear rise)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from megarl.config import load_config
    from megarl.data.preference import load_preference_pairs
    from megarl.observe.run_files import read_metrics

    grpo = {"data.train_batch_size": 32, "algorithm.ppo_mini_batch_size": 32, "reward.micro_batch_size": 32}
    run = example("reward_model").main(
        steps=10, **grpo, **{"logging.report": False, "trainer.save_every": -1}
    )
    rm = {h["step"]: h for h in run["rm"]}
    before, after = rm[0], rm[max(rm)]
    assert after["val/rm/accuracy"] >= 0.8  # chance is 0.5; a fresh head starts near it
    assert after["val/rm/margin"] > 0 and after["val/rm/loss"] < before["val/rm/loss"]
    for key in ("rm/loss", "rm/accuracy", "rm/margin", "rm/chosen", "rm/rejected", "rm/grad_norm"):
        assert all(key in h for s, h in rm.items() if s > 0), key

    # the export is a transformers sequence classifier giving megarl's held-out margin
    export, out = Path(run["rm_model"]), workdir / "outputs/examples/reward_model"
    model = AutoModelForSequenceClassification.from_pretrained(export, dtype=torch.float32).eval()
    assert model.config.num_labels == 1 and model.config.architectures == ["LlamaForSequenceClassification"]
    cfg = load_config(REPO / "configs/quickstart_rm.yaml", [f"model.path={export}"], check_paths=False)
    pairs = load_preference_pairs(
        [str(out / "val_pairs.parquet")], AutoTokenizer.from_pretrained(export), cfg.data, "x"
    )
    with torch.no_grad():
        score = [
            [
                model(torch.tensor([p.prompt_ids + ids])).logits.item()
                for ids in (p.chosen_ids, p.rejected_ids)
            ]
            for p in pairs
        ]
    margin = sum(c - r for c, r in score) / len(score)
    assert margin == pytest.approx(after["val/rm/margin"], abs=1e-4)  # fp32, different op orders
    assert read_metrics(out / "rm" / "metrics.jsonl")[-1]["step"] == max(rm)
    check_rm_checkpoint(out / "rm" / "checkpoints" / f"step_{max(rm)}", export, workdir / "converted")

    history = run["grpo"]
    val = [h["val/reward/mean"] for h in history if "val/reward/mean" in h]
    scores = [h["reward/learned_rm/mean"] for h in history if h["step"] > 0]
    assert len(val) == 2 and val[1] > val[0] + 0.3, val  # the same prompts, greedy: seen +1.09
    assert sum(scores[-3:]) / 3 > sum(scores[:3]) / 3, scores


def check_rm_checkpoint(step_dir: Path, export: Path, out: Path) -> None:
    """A reward model's checkpoint: resumable as one (not by an LM job), and `megarl convert` writes the
    export bit for bit."""
    from safetensors.torch import load_file

    from megarl.checkpoint.format import CheckpointError
    from megarl.checkpoint.hf_export import export_checkpoint_hf
    from megarl.checkpoint.run import precheck_roles
    from megarl.config import load_config
    from megarl.trainer.reward_model import rm_config
    from megarl.trainer.sft import sft_config

    cfg = load_config(step_dir / "config.yaml", check_paths=False)
    steps = int(step_dir.name.removeprefix("step_"))
    precheck_roles(step_dir, rm_config(cfg), steps, ["actor"])  # what a resume checks first
    with pytest.raises(CheckpointError, match="head scalar"):  # an LM job cannot resume into it
        precheck_roles(step_dir, sft_config(cfg), steps, ["actor"])
    converted = Path(export_checkpoint_hf(step_dir / "actor", out)["out"])
    assert json.loads((converted / "config.json").read_text()) == json.loads(
        (export / "config.json").read_text()
    )
    ours, theirs = load_file(converted / "model.safetensors"), load_file(export / "model.safetensors")
    assert ours.keys() == theirs.keys() and "score.weight" in ours
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
