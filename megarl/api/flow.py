"""The Python API's Dataflow: the trainer's stage graph, plus the entry points of the programmable API.

    flow = Dataflow.ppo(actor, critic, reference, reward, config="run.yaml")   # a PPOTrainer's graph
    flow.insert_after("reward", Stage("length_penalty", penalise, reads=("responses",), writes=(...)))
    flow.connect(actor.output, reward_model.input)
    history = flow.run(steps=10)          # or flow.run(num_epochs=2): trains, returns those steps' metrics
    flow.trainer.close()

`Dataflow.ppo`/`.grpo` build the trainer (megarl.api.trainers) and return its graph, editable stage by
stage; `flow.trainer` is that trainer. `flow.run(batch, ctx)` still runs one step's stages on a batch.
"""

from __future__ import annotations

from typing import Any

from megarl.protocol import Batch
from megarl.trainer.dataflow import Dataflow as StageGraph
from megarl.trainer.dataflow import DataflowError, StepContext


class Dataflow(StageGraph):
    trainer: Any = None  # the PPOTrainer/GRPOTrainer whose step this graph is (set by the trainer)

    @classmethod
    def ppo(
        cls, actor: Any, critic: Any, reference: Any = None, reward: Any = None, **kwargs: Any
    ) -> Dataflow:
        """The graph of a new PPOTrainer (kwargs: config=, overrides=, stream=)."""
        from megarl.api.trainers import PPOTrainer

        return PPOTrainer(actor=actor, critic=critic, reference=reference, reward=reward, **kwargs).flow

    @classmethod
    def grpo(cls, actor: Any, reference: Any = None, reward: Any = None, **kwargs: Any) -> Dataflow:
        """The graph of a new GRPOTrainer (kwargs: config=, overrides=, stream=)."""
        from megarl.api.trainers import GRPOTrainer

        return GRPOTrainer(actor=actor, reference=reference, reward=reward, **kwargs).flow

    def run(
        self,
        batch: Batch | None = None,
        ctx: StepContext | None = None,
        *,
        steps: int | None = None,
        num_epochs: int | None = None,
    ) -> Any:
        """`run(steps=N)` / `run(num_epochs=N)`: train N more steps (epochs) through this graph, returning
        their metrics; `run(batch, ctx)`: one pass of the stages over `batch`."""
        if steps is None and num_epochs is None:
            if batch is None or ctx is None:
                raise DataflowError(
                    "flow.run(steps=N) or flow.run(num_epochs=N) trains; run(batch, ctx) runs one step"
                )
            return super().run(batch, ctx)
        if self.trainer is None:
            raise DataflowError(
                "this flow belongs to no trainer: build it with Dataflow.ppo(...)/Dataflow.grpo(...) or take "
                "trainer.flow"
            )
        return self.trainer.run_for(steps=steps, num_epochs=num_epochs)
