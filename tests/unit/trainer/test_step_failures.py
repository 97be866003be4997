"""How a step fails: trainer.max_bad_steps (updates skipped for a NaN/inf norm, counted and stopped),
and a worker failure named by step and stage."""

import contextlib
import types

import pytest
import torch

from megarl.controller.worker import WorkerError
from megarl.protocol import Batch
from megarl.trainer.bad_steps import BadStepCounter, BadStepsError
from megarl.trainer.dataflow import Dataflow, Stage
from megarl.trainer.rl_trainer import RLTrainer

pytestmark = pytest.mark.unit


def test_bad_steps_in_a_row_stop_the_run_naming_them():
    counter = BadStepCounter(max_in_a_row=2)
    seen = []
    for step, bad in [(1, 1.0), (2, 0.0), (3, 2.0)]:
        metrics = {"actor/bad_updates": bad, "critic/bad_updates": 0.0}
        counter.update(step, metrics)
        seen.append(metrics["trainer/bad_steps"])
    assert seen == [1.0, 1.0, 2.0]  # a good step in between resets the run, not the total
    counter.check()  # steps 2 and 3 were not both bad
    counter.update(4, {"critic/bad_updates": 1.0})
    restored = BadStepCounter(max_in_a_row=2)  # what a resumed run restores from its checkpoint
    restored.load_state_dict(counter.state_dict())
    with pytest.raises(BadStepsError, match="steps 3, 4: 2 steps in a row") as e:
        restored.check()
    assert "lower the learning rate" in str(e.value) and "last checkpoint is unaffected" in str(e.value)


def test_steps_without_updates_are_not_bad():
    counter = BadStepCounter(max_in_a_row=1)
    metrics = {"reward/mean": float("nan")}
    counter.update(1, metrics)
    assert metrics["trainer/bad_steps"] == 0.0


def test_a_worker_error_names_the_step_and_stage_and_how_to_resume(tmp_path):
    def dies(ctx, batch):
        raise WorkerError("actor.update failed on rank 1 of 2 on node3 (pid 7): ...", "actor", 1, "node3", 7)

    trainer = RLTrainer.__new__(RLTrainer)  # only what a step touches
    trainer.cfg = types.SimpleNamespace(
        trainer=types.SimpleNamespace(eval_every=0, save_every=-1, resume="auto")
    )
    trainer.output_dir = tmp_path
    trainer.val_data = None
    trainer.profiler = types.SimpleNamespace(step=lambda step: contextlib.nullcontext())
    trainer.next_prompts = lambda: Batch(tensors={"x": torch.zeros(2)})
    trainer.flow = Dataflow(
        [Stage("log_prob", lambda c, b: None), Stage("update_actor", dies)], inputs=("x",)
    )
    with pytest.raises(
        WorkerError, match=r"^step 3, stage update_actor: actor\.update failed on rank 1"
    ) as e:
        trainer._run_step(3)
    assert (e.value.role, e.value.rank, e.value.host, e.value.pid) == ("actor", 1, "node3", 7)
    assert str(e.value).endswith(  # no checkpoint was saved: the rerun starts afresh
        f"no checkpoint was saved under {tmp_path / 'checkpoints'}, so rerunning starts from step 0 "
        "(trainer.save_every=N saves every N steps)"
    )
