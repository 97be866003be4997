"""RLTrainer: PPO, GRPO, Dr.GRPO, RLOO, REINFORCE++ and ReMax as one loop over a dataflow of stages.

    from megarl.config import load_config
    from megarl.trainer import RLTrainer
    with RLTrainer(load_config("configs/quickstart_grpo.yaml", ["trainer.total_steps=5"])) as trainer:
        trainer.flow.insert_after("reward", my_stage)   # optional: edit the step graph
        metrics = trainer.step()                        # one step: its metrics
        history = trainer.fit()                         # the rest: one metrics dict per step
        history = trainer.fit(total_steps=8)            # three more, same workers
    # leaving the block (or trainer.close()) stops every worker process

The same trainer runs under `trainer.launcher=ray` (this process is the single controller; the worker
groups are Ray actors) and `trainer.launcher=torchrun` (every process runs this loop, SPMD; only rank 0
writes files). The run's lifecycle — resume, logging, workers, checkpoints, shutdown, report — is its
RunSession's (megarl.trainer.run_session); `close()` (idempotent) stops every worker process, flushes
and closes every logging backend and writes the report, also after a crash.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

from megarl.agentic.metrics import AGENT_COLUMNS, agent_metrics
from megarl.algorithms.aggregate import masked_mean
from megarl.checkpoint.run import RL_JOB, ResumeError, capture_rng, restore_rng, resume_advice, save_due
from megarl.config.schema import MegarlConfig
from megarl.config.validate import resolve_for_run
from megarl.controller.rank_status import RANK_STATUS
from megarl.controller.worker import WorkerError
from megarl.observe.run_files import read_metrics
from megarl.protocol import Batch, Col
from megarl.trainer.bad_steps import BadStepCounter
from megarl.trainer.dataflow import Dataflow, StepContext
from megarl.trainer.rl_stages import build_rl_dataflow
from megarl.trainer.roles import RoleGroups
from megarl.trainer.run_session import RunSession, SessionTrainer
from megarl.trainer.scoring import scoring_stages

if TYPE_CHECKING:
    from megarl.trainer.rollout_pool import RolloutPool


class RLTrainer(SessionTrainer):
    flow_class: type[Dataflow] = Dataflow  # the step graph's class (the Python API's adds run(steps=...))
    _stage_states: dict[str, Any] | None = None  # a resumed run's, for stages added before the first step
    pool: RolloutPool | None = None  # the engines' own pool (rollout.placement=separate)

    def __init__(
        self,
        cfg: MegarlConfig,
        roles: RoleGroups | None = None,
        reward: Any = None,
        stream: TextIO | None = None,
    ) -> None:
        """Load the data and the rewards, check trainer.resume's checkpoint, then start the workers (or
        use `roles`, already started) and restore the checkpoint; anything failing here closes them."""
        from megarl.data.chat import load_tokenizer
        from megarl.data.datasets import PromptDataset
        from megarl.data.loader import PromptLoader
        from megarl.rewards import RewardComputer

        self.cfg = cfg = resolve_for_run(cfg)  # a config edited in Python is checked again here
        # Everything that can be wrong with the data or the rewards fails here, before any worker starts.
        self.tokenizer = load_tokenizer(cfg.model)
        self.reward = reward or RewardComputer.from_config(cfg, self.tokenizer)
        # the rule rewards compare with each row's ground truth: rows without one are reported and skipped
        truth = self.reward.needs_ground_truth
        self.train_data = PromptDataset.from_config(
            cfg.data, self.tokenizer, "train", require_ground_truth=truth
        )
        self.val_data = (
            PromptDataset.from_config(cfg.data, self.tokenizer, "val", require_ground_truth=truth)
            if cfg.data.val_files
            else None
        )
        self.loader = PromptLoader.from_config(cfg.data, self.train_data)
        if reward is None:
            self.reward.check_data_sources(self.train_data.data_sources, "data.train_files")
            if self.val_data is not None:
                self.reward.check_data_sources(self.val_data.data_sources, "data.val_files")
        total_steps = cfg.trainer.total_steps or cfg.trainer.total_epochs * self.loader.steps_per_epoch
        self._next_uid = 0
        self.bad_steps = BadStepCounter(cfg.trainer.max_bad_steps)
        self.output_dir = Path(cfg.trainer.output_dir)
        # trainer.resume: the checkpoint to continue from, checked before any worker starts
        self.session = session = RunSession(cfg, RL_JOB, total_steps, stream, roles)
        self.resume_from, resumed = session.resume_from, session.resumed
        if resumed is not None:
            try:
                self.loader.load_state_dict(resumed["data"])
            except ValueError as e:  # another data set or data.seed
                session.close()  # the run lock
                raise ResumeError(f"{self.resume_from}: {e}") from None
        self.start_step = self.done_step = session.start_step
        self.best_val_reward: float | None = None
        self.is_writer = session.is_writer
        self.history: list[dict[str, float]] = []
        self._began = False
        try:  # stop the worker processes and close the logging backends if anything below fails
            self.reward.start()  # the reward workers load while the model workers start
            self.roles = session.start()
            self.log, self.profiler, self.checkpoints = session.log, session.profiler, session.checkpoints
            self.is_writer = session.is_writer
            if self.roles.rollout is not None:  # rollout.placement=separate
                from megarl.trainer.rollout_pool import RolloutPool

                self.pool = RolloutPool(cfg, self.roles.actor, self.roles.rollout, self.next_prompts)
            self.flow, self.kl_ctrl = build_rl_dataflow(
                cfg, self.roles, self.reward, self.next_prompts, self.flow_class, self.pool
            )
            session.resume_groups()
            if resumed is not None:
                self._resume(resumed)
            # a resumed run's history starts with the steps its checkpoint had done (from metrics.jsonl)
            self.history = self._earlier_history()
        except BaseException:
            self.close()
            raise

    def fit(self, total_steps: int | None = None) -> list[dict[str, float]]:
        """Run the steps after the last one done up to `total_steps` (default: the current target,
        trainer.total_steps at first), validating every trainer.eval_every and after the last, then
        export (trainer.save_hf) and write summary.json; returns every step's metrics so far (a resumed
        run's included). The workers keep running: a later `fit(total_steps=…)` continues. The actor's
        LR schedule spans the configured total; steps past it keep its final learning rate."""
        self._retarget(total_steps)
        if (nothing_left := self.session.nothing_left(self.done_step, self.cfg.trainer.save_hf)) is not None:
            self.log.warn(nothing_left)
        self._begin()
        if self.cfg.trainer.val_only:  # validated in _begin; nothing is trained
            self._write_summary(self.history)
            return self.history
        self._train_to_target()  # a stop signal ends it after a step, with a checkpoint (Preempted)
        if self.cfg.trainer.save_hf:
            with self.log.task(f"writing the actor as a Hugging Face model to {self.output_dir / 'hf'}"):
                self.roles.actor.export_hf(str(self.output_dir / "hf"))
        self._write_summary(self.history)
        return self.history

    def step(self) -> dict[str, float]:
        """Run the step after the last one done (validating and saving when due, logged as `fit` logs
        it) and return its metrics. A step past the target makes it the target (and so the last)."""
        self._begin()
        step = self._next_step()
        metrics = self._run_step(step)
        self.log.log(step, metrics)
        self.history.append({"step": step, **metrics})
        self.done_step = step
        self.bad_steps.check()  # BadStepsError after trainer.max_bad_steps bad steps in a row
        return metrics

    def close(self) -> None:
        """Stop every worker process (the reward workers too), flush and close the logging backends and
        write the report (logging.report, once training began); idempotent."""
        try:
            super().close()
        finally:
            if getattr(self, "reward", None) is not None:
                self.reward.close()

    def _begin(self) -> None:
        """Once per trainer, before its first step: describe the run and validate at step 0 (a fresh
        run with trainer.val_before_train), or at the step it resumes from (trainer.val_only)."""
        if self._began:
            return
        self._began = self.session.began_training = True
        if self._stage_states is not None:  # now, so that stages added after __init__ get theirs too
            try:
                problems = self.flow.load_state_dict(self._stage_states)
            except ValueError as e:
                raise ResumeError(f"{self.resume_from}: {e}") from None
            for problem in problems:
                self.log.warn(f"megarl: resuming from {self.resume_from}: {problem}")
        self.log.message(f"megarl: {self._describe()}\n{self.flow.describe()}")
        t = self.cfg.trainer
        if self.val_data is not None and (t.val_only or (self.start_step == 0 and t.val_before_train)):
            metrics = self.validate(step=self.start_step)
            self.log.log(self.start_step, metrics)
            self.history.append({"step": self.start_step, **metrics})

    def _run_step(self, step: int) -> dict[str, float]:
        """Train, validate when due, save when due; a failed worker call names the step and stage."""
        stage = None
        try:
            metrics = self.train_step(step)
            every = self.cfg.trainer.eval_every
            if self.val_data is not None and every and (step % every == 0 or step == self.total_steps):
                stage = "validate"
                metrics.update(self.validate(step))
            if save_due(step, self.total_steps, self.cfg.trainer.save_every):
                stage = "save_checkpoint"
                metrics.update(self.save_checkpoint(step))
            return metrics
        except WorkerError as e:  # the group's processes are already stopped
            raise WorkerError(
                f"step {step}, stage {stage or self.flow.current or 'train_step'}: {e}\n"
                + resume_advice(self.output_dir, self.cfg.trainer.resume),
                e.role,
                e.rank,
                e.host,
                e.pid,
            ) from None

    def train_step(self, step: int) -> dict[str, float]:
        with self.profiler.step(step):  # trainer.profile_steps: traces and per-rank call times
            start = time.perf_counter()
            prompts = self.next_prompts()
            ctx = StepContext(step=step)
            RANK_STATUS.set_step(step)
            batch = self.flow.run(prompts, ctx)
            seconds = time.perf_counter() - start
        metrics = {**ctx.metrics, **batch_statistics(batch)}
        self.bad_steps.update(step, metrics)
        tokens = float(batch["attention_mask"].sum())
        if "async/wait_seconds" in metrics:  # a separate rollout pool: how busy each pool was this step
            metrics["async/trainer_busy_share"] = max(0.0, 1.0 - metrics["async/wait_seconds"] / seconds)
            metrics["async/engine_busy_share"] = min(1.0, metrics["async/engine_generate_seconds"] / seconds)
        metrics.update(
            {
                "step_seconds": seconds,
                "batch/sequences": len(batch),
                "throughput/tokens_per_s": tokens / seconds,
                "data/epoch": self.loader.epoch,
            }
        )
        return metrics

    def next_prompts(self) -> Batch:
        """The next training prompts, each with a `uid` never used before (its samples' group id)."""
        before = {"data": self.loader.state_dict(), "next_uid": self._next_uid}
        prompts = self.loader.next_batch()
        prompts["uid"] = torch.arange(self._next_uid, self._next_uid + len(prompts))
        self._next_uid += len(prompts)
        if self.pool is not None:  # a separate rollout pool draws ahead: the position its checkpoint records
            prompts.meta["data_state"] = before
        return prompts

    def validate(self, step: int) -> dict[str, float]:
        """Greedy (rollout.val) responses to every validation prompt, scored by the reward: mean score
        overall (`val/reward/mean`) and per data_source (`val/<data_source>/reward/mean`)."""
        if self.val_data is None:
            raise ValueError("validate() needs data.val_files")
        val_data, dump_dir = self.val_data, self.cfg.trainer.validation_data_dir
        start = time.perf_counter()
        # the flow's own generate and scoring stages (a user's reward or added scoring stage included)
        stages = [self.flow["generate"], *scoring_stages(self.flow)]
        scores, sources, samples, turns = [], [], [], []
        errors: float | None = None
        for prompts in val_data.batches(self.cfg.data.val_batch_size or len(val_data)):
            ctx = StepContext(step=step, validate=True)
            rollout = prompts
            for stage in stages:
                rollout = stage.run(ctx, rollout)
            scores.append(rollout["scores"].float())
            if "num_turns" in rollout:
                turns.append(rollout.select(AGENT_COLUMNS))
            if "reward/errors" in ctx.metrics:
                errors = (errors or 0.0) + ctx.metrics["reward/errors"]
            batch_sources = (
                list(rollout["data_source"]) if "data_source" in rollout else ["val"] * len(rollout)
            )
            sources += batch_sources
            if dump_dir and self.is_writer:
                samples += self._samples(step, rollout, batch_sources)
        if dump_dir and samples:
            write_samples(Path(dump_dir) / f"step_{step}.jsonl", samples)
        scores_t = torch.cat(scores)
        metrics = {"val/reward/mean": scores_t.mean().item()}
        if turns:  # a multi-turn rollout's turns, tool calls and tool errors, on the validation prompts
            metrics.update({f"val/{k}": v for k, v in agent_metrics(Batch.concat(turns)).items()})
        if errors is not None:
            metrics["val/reward/errors"] = errors
        for source in sorted(set(sources)):
            picked = torch.tensor([s == source for s in sources])
            metrics[f"val/{source}/reward/mean"] = scores_t[picked].mean().item()
        metrics["timing/validate"] = time.perf_counter() - start
        best = self.best_val_reward
        self.best_val_reward = (
            metrics["val/reward/mean"] if best is None else max(best, metrics["val/reward/mean"])
        )
        return metrics

    def _samples(self, step: int, rollout: Batch, sources: list[str]) -> list[dict[str, Any]]:
        """verl's validation dump records (input, output, score, step), plus the response token ids."""
        records = []
        multi_turn = "num_turns" in rollout
        for i in range(len(rollout)):
            prompt = rollout[Col.PROMPTS][i]
            attention = rollout[Col.ATTENTION_MASK][i] > 0
            prompt_ids = prompt[attention[: prompt.numel()]].tolist()
            response = attention[prompt.numel() :]
            ids = rollout[Col.RESPONSES][i][response].tolist()  # a multi-turn response: tool outputs too
            record = {
                "step": step,
                "input": self.tokenizer.decode(prompt_ids, skip_special_tokens=True),
                "output": self.tokenizer.decode(ids, skip_special_tokens=True),
                "score": float(rollout[Col.SCORES][i]),
                "data_source": sources[i],
                "input_ids": prompt_ids,
                "output_ids": ids,
            }
            if multi_turn:  # which output ids the model generated (1) and which it was given (0)
                record["output_mask"] = rollout[Col.RESPONSE_MASK][i][response].long().tolist()
                record["num_turns"] = int(rollout["num_turns"][i])
                record["tool_calls"] = int(rollout["tool_calls"][i])
            records.append(record)
        return records

    def remap(self, role: str, target: Any) -> dict[str, Any]:
        """Move `role` ("actor", with its colocated reference and rollout engine, or "critic") to
        `target` — a DeviceMap (devices and layout) or a ParallelConfig / dict of its fields (another
        layout on the same devices) — between steps, without restarting the driver: its full training
        state goes through a temporary role checkpoint (in /dev/shm when it fits) into a new worker group,
        and the config records the new layout (the next checkpoint's config.yaml). A target that cannot
        work raises ConfigError (or RemapError) before anything stops. Ray only. Returns {role, from,
        to, seconds, bytes, where ("memory" | "disk"), path, rng}; see megarl.trainer.remap."""
        from megarl.config.errors import ConfigError
        from megarl.trainer.remap import RemapError, refused, remap_role

        try:
            return remap_role(self, role, target)
        except (ConfigError, RemapError) as e:
            if not str(e).startswith(f"remap({role!r}) failed after"):
                self.log.warn(refused(e, role))
            raise

    # ---- checkpoints ---------------------------------------------------------------------------------

    def save_checkpoint(self, step: int) -> dict[str, float]:
        """Save every trained role and the trainer's state as checkpoints/step_<step>; returns its metrics."""
        from megarl.config import config_to_yaml

        with self.log.task(f"saving checkpoint step_{step}"):
            report = self.checkpoints.save(step, self.trainer_state(), config_to_yaml(self.cfg))
        return report.metrics()

    def trainer_state(self) -> dict[str, Any]:
        """What the driver must restore for the next step to be the one an uninterrupted run takes."""
        # a separate rollout pool drew prompts ahead of training: the position before the oldest of them,
        # so a resumed run draws (and generates) them again and trains every prompt once
        ahead = self.pool.data_state() if self.pool is not None else None
        return {
            "job": RL_JOB,
            "data": ahead["data"] if ahead else self.loader.state_dict(),
            "kl_ctrl": self.kl_ctrl.state_dict(),
            "next_uid": ahead["next_uid"] if ahead else self._next_uid,
            "best_val_reward": self.best_val_reward,
            "bad_steps": self.bad_steps.state_dict(),
            "driver_rng": capture_rng(),
            "stages": self.flow.state_dict(),  # stages that keep state (a data position of their own)
        }

    def _resume(self, state: dict[str, Any]) -> None:
        """The driver's part of the checkpoint (the session restored the workers')."""
        self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self._next_uid = state["next_uid"]
        self.best_val_reward = state["best_val_reward"]
        self.bad_steps.load_state_dict(state["bad_steps"])
        self._stage_states = state.get("stages", {})  # restored at the first step (_begin)
        if self.cfg.trainer.launcher != "torchrun":  # under torchrun the workers restored this process's
            restore_rng(state["driver_rng"])
        self.log.message(f"megarl: resumed from {self.resume_from} (step {self.start_step} done)")

    def _earlier_history(self) -> list[dict[str, float]]:
        if self.start_step == 0 or self.log.path is None:
            return []
        return [r for r in read_metrics(self.log.path) if r["step"] <= self.start_step]

    def _describe(self) -> str:
        c = self.cfg
        return (
            f"{c.algorithm.name} ({c.algorithm.adv_estimator}) on {c.model.path}, {self.total_steps} steps of "
            f"{c.data.train_batch_size} prompts × {c.rollout.n} samples, launcher {c.trainer.launcher}, "
            f"stages: {' → '.join(self.flow.names)}"
        )

    def _write_summary(self, history: list[dict[str, float]]) -> None:
        if not self.is_writer or not history:
            return
        train = [h for h in history if h["step"] > 0]
        val = [h for h in history if "val/reward/mean" in h]
        summary = {
            "steps": self.total_steps,
            "first_reward": train[0].get("reward/mean") if train else None,
            "last_reward": train[-1].get("reward/mean") if train else None,
            "val_reward_before": val[0]["val/reward/mean"] if val else None,
            "val_reward_after": val[-1]["val/reward/mean"] if val else None,
            "max_train_rollout_logprob_abs_diff": max(
                (h.get("train_rollout_logprob_abs_diff_max", 0.0) for h in train), default=None
            ),
            "seconds": sum(h.get("step_seconds", 0.0) for h in train),
        }
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def write_samples(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def batch_statistics(batch: Batch) -> dict[str, float]:
    """reward/*, response_length/*, finish-reason shares of one step's rollout batch. A response's length
    is its generated tokens (response_mask): a multi-turn response's tool outputs and user turns are not
    counted; response_length/clip_ratio is the share of responses that ended at the token limit."""
    scores = batch["scores"].float()
    lengths = batch["response_mask"].sum(-1).float()
    out = {
        "reward/mean": scores.mean().item(),
        "reward/std": scores.std().item() if len(scores) > 1 else 0.0,
        "reward/max": scores.max().item(),
        "reward/min": scores.min().item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/p50": lengths.quantile(0.5, interpolation="lower").item(),
        "response_length/p90": lengths.quantile(0.9, interpolation="lower").item(),
    }
    if "finish_reason" in batch:
        out["response_length/clip_ratio"] = sum(r == "length" for r in batch["finish_reason"]) / len(batch)
    if "advantages" in batch:
        out["advantages/abs_mean"] = masked_mean(batch["advantages"].abs(), batch["response_mask"]).item()
    return {k: v for k, v in out.items() if math.isfinite(v)}
