"""Steps whose update was skipped for a NaN/inf gradient norm ("bad" steps), and when they stop the run.

The optimizer never applies a non-finite update (`megarl.models.optimizer.TrainOptimizer.step`); the
trained roles report how many they skipped per call as `<role>/bad_updates`. A step with any is bad.
`trainer/bad_steps` counts them over the run; `trainer.max_bad_steps` in a row raise `BadStepsError`.
Only the non-finite update is skipped: a step's other mini-batches and roles, the KL controller and the
data position still advance (the step is not replayed).
"""

from __future__ import annotations

from megarl.errors import MegarlError


class BadStepsError(MegarlError, RuntimeError):
    """Too many steps in a row had a non-finite gradient norm (`megarl train` exits 1)."""


class BadStepCounter:
    def __init__(self, max_in_a_row: int) -> None:
        self.max_in_a_row = max_in_a_row
        self.total = 0
        self.in_a_row: list[int] = []  # the current run of bad steps

    def update(self, step: int, metrics: dict[str, float]) -> None:
        """Count `step` (its metrics gain `trainer/bad_steps`)."""
        bad = any(v > 0 for k, v in metrics.items() if k.endswith("/bad_updates"))
        if bad:
            self.total += 1
            self.in_a_row.append(step)
        else:
            self.in_a_row.clear()
        metrics["trainer/bad_steps"] = float(self.total)

    def check(self) -> None:
        """BadStepsError once the last max_in_a_row steps were all bad (call after logging the step)."""
        if len(self.in_a_row) >= self.max_in_a_row:
            steps = ", ".join(map(str, self.in_a_row))
            raise BadStepsError(
                f"steps {steps}: {len(self.in_a_row)} steps in a row (trainer.max_bad_steps={self.max_in_a_row}) "
                "had a NaN/inf loss or gradient norm, so their updates were skipped; lower the learning rate "
                "(actor.optimizer.lr / critic.optimizer.lr), check the data and rewards for NaN/inf, or raise "
                "trainer.max_bad_steps. The weights were never updated with a non-finite gradient: the last "
                "checkpoint is unaffected"
            )

    def state_dict(self) -> dict:
        return {"total": self.total, "in_a_row": list(self.in_a_row)}

    def load_state_dict(self, state: dict) -> None:
        self.total, self.in_a_row = state["total"], list(state["in_a_row"])
