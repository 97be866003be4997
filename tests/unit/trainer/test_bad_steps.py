"""trainer.max_bad_steps: steps whose update was skipped for a NaN/inf norm, counted and stopped."""

import pytest

from megarl.trainer.bad_steps import BadStepCounter, BadStepsError

pytestmark = pytest.mark.unit


def test_bad_steps_in_a_row_stop_the_run_naming_them():
    counter = BadStepCounter(max_in_a_row=2)
    seen = []
    for step, bad in [(1, 1.0), (2, 0.0), (3, 2.0)]:
        metrics = {"actor/bad_updates": bad, "critic/bad_updates": 0.0}
        counter.update(step, metrics)
        seen.append(metrics["trainer/bad_steps"])
    assert seen == [1.0, 1.0, 2.0]  # a good step in between resets the run, not the total
    with pytest.raises(BadStepsError, match="steps 3, 4: 2 steps in a row") as e:
        counter.update(4, {"critic/bad_updates": 1.0})
    assert "lower the learning rate" in str(e.value) and "last checkpoint is unaffected" in str(e.value)


def test_steps_without_updates_are_not_bad():
    counter = BadStepCounter(max_in_a_row=1)
    metrics = {"reward/mean": float("nan")}
    counter.update(1, metrics)
    assert metrics["trainer/bad_steps"] == 0.0
