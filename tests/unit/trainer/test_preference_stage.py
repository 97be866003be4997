"""The preference_update stage on stand-in groups: the next pairs each step, the reference's sequence
sums, the weight passed to the actor, `preference/` metrics, its position through the graph's state;
and add_preference_update's wiring and refusals."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from megarl.algorithms.preference_terms import PreferenceSettings
from megarl.config.errors import ConfigError
from megarl.config.schema import MegarlConfig
from megarl.data.loader import PairLoader
from megarl.data.preference import PreferencePair
from megarl.protocol import Batch
from megarl.trainer.dataflow import Dataflow, Stage, StepContext
from megarl.trainer.preference_stage import (
    PreferenceUpdate,
    add_preference_update,
    preference_metrics,
    preference_update_stage,
)
from megarl.trainer.rl_trainer import RLTrainer
from tests.helpers.data import write_parquet

pytestmark = pytest.mark.unit

WORKER_METRICS = {
    "loss": 0.25,
    "unweighted_loss": 0.5,
    "rewards/accuracy": 0.75,
    "rewards/margin": 0.1,
    "grad_norm": 2.0,
    "bad_updates": 0.0,
}


class FakeActor:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def preference_update(self, batch, settings, counts, weight=1.0):
        self.calls.append((batch, settings, counts, weight))
        return [dict(WORKER_METRICS), dict(WORKER_METRICS)]  # one per DP replica


class FakeRef:
    def ref_log_prob(self, batch):
        return Batch({"ref_log_probs": torch.full(batch["responses"].shape, -0.5)})


def _pairs(n: int = 6) -> list[PreferencePair]:
    return [PreferencePair(f"row {i}", [1, 2], [10 + i, 3, 0], [20 + i, 0]) for i in range(n)]


def test_each_step_updates_on_the_next_pairs_with_the_weight_and_logs_preference_metrics():
    actor = FakeActor()
    loader = PairLoader(_pairs(), batch_size=2, seed=0, pad_token_id=0)
    stage = preference_update_stage(actor, FakeRef(), loader, PreferenceSettings("dpo", 0.1), 0.5)
    assert (stage.name, stage.reads, stage.writes) == ("preference_update", (), ())
    ctx = StepContext(step=1)
    stage.run(ctx, Batch({"responses": torch.zeros(8, 3)}))  # the rollouts are not read

    batch, settings, counts, weight = actor.calls[0]
    assert weight == 0.5 and settings.name == "dpo"
    assert len(batch) == 4 and counts.items == 2
    assert counts.chosen_tokens == int(batch["response_mask"][0::2].sum()) == 6
    # the reference's sequence sums: -0.5 per response token (chosen 3 tokens, rejected 2)
    assert batch["ref_logps"].tolist() == [-1.5, -1.0, -1.5, -1.0]
    assert ctx.metrics["preference/loss"] == 0.5 and ctx.metrics["preference/weighted_loss"] == 0.25
    assert ctx.metrics["preference/rewards/accuracy"] == 0.75
    assert ctx.metrics["preference/grad_norm"] == 2.0 and "preference/bad_updates" in ctx.metrics
    assert not any(k.startswith("actor/") for k in ctx.metrics)  # the PPO update's names stay its own

    stage.run(StepContext(step=2), Batch({}))
    firsts = [set(call[0]["responses"][0::2, 0].tolist()) for call in actor.calls]
    assert not firsts[0] & firsts[1]  # the next pairs


def test_losses_without_a_reference_do_not_ask_for_one():
    actor = FakeActor()
    loader = PairLoader(_pairs(), batch_size=2, seed=0, pad_token_id=0)
    preference_update_stage(actor, None, loader, PreferenceSettings("simpo", 2.0), 1.0).run(
        StepContext(step=1), Batch({})
    )
    assert "ref_logps" not in actor.calls[0][0]


def test_the_position_in_the_pairs_survives_a_restore_through_the_graph():
    def flow():
        loader = PairLoader(_pairs(), batch_size=2, seed=0, pad_token_id=0)
        return Dataflow(
            [preference_update_stage(FakeActor(), FakeRef(), loader, PreferenceSettings("dpo", 0.1), 1)]
        )

    first = flow()
    for step in (1, 2):
        first.run(Batch({}), StepContext(step=step))
    saved = first.state_dict()
    assert saved == {"preference_update": {"pairs": {"epoch": 0, "position": 4, "seed": 0, "n_rows": 6}}}

    resumed = flow()
    assert resumed.load_state_dict(saved) == []
    resumed.run(Batch({}), StepContext(step=3))
    first.run(Batch({}), StepContext(step=3))
    batches = [f["preference_update"].fn.actor.calls[-1][0] for f in (first, resumed)]
    assert torch.equal(batches[0]["responses"], batches[1]["responses"])


def _trainer(flow: Dataflow) -> RLTrainer:
    """An RLTrainer with only what trainer_state, _resume and _begin touch (no workers, no data)."""
    trainer = RLTrainer.__new__(RLTrainer)
    trainer.cfg, trainer.flow, trainer.val_data = MegarlConfig(), flow, None
    trainer.loader = trainer.kl_ctrl = trainer.bad_steps = SimpleNamespace(
        state_dict=lambda: {}, load_state_dict=lambda state: None
    )
    trainer._next_uid, trainer.best_val_reward, trainer._began = 0, None, False
    trainer.start_step, trainer.resume_from = 2, "checkpoints/step_2"
    trainer.session = SimpleNamespace(total_steps=3, began_training=False)
    trainer.log = SimpleNamespace(message=lambda text: None, warnings=[])
    trainer.log.warn = trainer.log.warnings.append
    return trainer


def test_rl_trainer_checkpoints_the_position_and_restores_it_before_the_first_step():
    def flow():
        loader = PairLoader(_pairs(), batch_size=2, seed=0, pad_token_id=0)
        stage = preference_update_stage(FakeActor(), FakeRef(), loader, PreferenceSettings("dpo", 0.1), 1)
        return Dataflow([Stage("update_actor", lambda ctx, batch: None), stage])

    ran = flow()
    for step in (1, 2):
        ran.run(Batch({}), StepContext(step=step))
    saved = json.loads(json.dumps(_trainer(ran).trainer_state()))  # as trainer_state.json holds it

    resumed = _trainer(flow())
    resumed._resume(saved)
    assert resumed.flow["preference_update"].fn.pairs.state_dict()["position"] == 0  # not yet: the user
    resumed._begin()  # adds the stage after __init__, so the first step restores it
    assert (
        resumed.flow["preference_update"].fn.pairs.state_dict()
        == ran["preference_update"].fn.pairs.state_dict()
    )
    assert resumed.log.warnings == []

    without = _trainer(Dataflow([Stage("update_actor", lambda ctx, batch: None)]))
    without._resume(saved)
    without._begin()
    assert without.log.warnings == [
        "megarl: resuming from checkpoints/step_2: the checkpoint has state for stage 'preference_update', "
        "which this graph lacks"
    ]


def test_bad_settings_are_refused():
    loader = PairLoader(_pairs(), batch_size=2, seed=0, pad_token_id=0)
    with pytest.raises(ValueError, match="unpaired examples"):
        PreferenceUpdate(FakeActor(), FakeRef(), loader, PreferenceSettings("kto", 0.1), 1.0)
    for weight in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="must be a positive number"):
            PreferenceUpdate(FakeActor(), FakeRef(), loader, PreferenceSettings("dpo", 0.1), weight)
    with pytest.raises(ValueError, match="needs `ref`"):
        PreferenceUpdate(FakeActor(), None, loader, PreferenceSettings("ipo", 0.1), 1.0)


def test_preference_metrics_name_the_preference_loss_and_what_was_backpropagated():
    assert preference_metrics(WORKER_METRICS) == {
        "preference/loss": 0.5,
        "preference/weighted_loss": 0.25,
        "preference/rewards/accuracy": 0.75,
        "preference/rewards/margin": 0.1,
        "preference/grad_norm": 2.0,
        "preference/bad_updates": 0.0,
    }


@pytest.fixture(scope="module")
def tokenizer():
    from megarl.models.tiny import build_tokenizer

    return build_tokenizer(1001)


@pytest.fixture
def trainer(tmp_path, tokenizer):
    rows = [
        {"prompt": f"reverse {i}{i + 1}", "chosen": f"{i + 1}{i}", "rejected": f"{i}{i + 1}"}
        for i in range(5)
    ]
    cfg = MegarlConfig()
    cfg.data.train_batch_size = 4
    update = Stage("update_actor", lambda ctx, batch: None, reads=("advantages",))
    return SimpleNamespace(
        cfg=cfg,
        tokenizer=tokenizer,
        roles=SimpleNamespace(actor=FakeActor(), ref=FakeRef()),
        flow=Dataflow([update, Stage("after", lambda ctx, batch: None)], inputs=("advantages",)),
        pairs=write_parquet(tmp_path / "pairs.parquet", rows),
    )


def test_add_preference_update_puts_the_stage_right_after_the_ppo_update(trainer):
    stage = add_preference_update(trainer, trainer.pairs, loss="ipo", beta=0.2, weight=0.25)
    assert trainer.flow.names == ["update_actor", "preference_update", "after"]
    assert stage.fn.weight == 0.25 and stage.fn.settings == PreferenceSettings("ipo", 0.2)
    assert stage.fn.pairs.batch_size == 4 and len(stage.fn.pairs.pairs) == 5
    trainer.flow.insert_before("update_actor", Stage("early", lambda ctx, batch: None))
    assert trainer.flow.names.index("preference_update") > trainer.flow.names.index("update_actor")


def test_add_preference_update_needs_the_reference_for_dpo_and_names_the_key(trainer):
    trainer.roles.ref = None
    with pytest.raises(ConfigError, match=r"set ref\.enable=true"):
        add_preference_update(trainer, trainer.pairs)
    assert add_preference_update(trainer, [trainer.pairs], loss="simpo").fn.settings.beta == 2.0
    with pytest.raises(ValueError, match="takes pairs"):
        add_preference_update(trainer, trainer.pairs, loss="kto")
