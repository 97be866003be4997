"""RunSession: the lifecycle every trainer shares, from the resume checks made before any worker starts
to the shutdown that stops them. A trainer keeps its data, rewards and step graph; the session owns the
rest of a run.

    session = RunSession(cfg, job="sft", total_steps=100)  # the run lock taken; trainer.resume found and
                                                            # checked; no process yet
    ...                                                     # the trainer checks its data against session.resumed
    session.start()          # progress log, config.yaml + run_info.json, worker groups, profiler, checkpoints
    session.resume_groups()  # the trained roles' weights, optimizer and RNG from session.resume_from
    ...                      # steps: session.log, session.profiler, session.checkpoints
    session.close()          # every worker process stopped, logging closed, the report written, the
                             # run lock released; idempotent

`logging.report` is written at close once training began (`began_training`), also after a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Self, TextIO

from megarl.checkpoint.paths import LATEST_FILE
from megarl.checkpoint.run import (
    RL_JOB,
    TRAINED_ROLES,
    RunCheckpoints,
    check_data_files,
    check_job,
    check_resumable,
    precheck_roles,
    read_trainer_state,
    resolve_resume,
)
from megarl.config.schema import MegarlConfig
from megarl.data.files import fingerprint_files
from megarl.distributed.preemption import PREEMPTION, Preempted
from megarl.observe.profiling import StepProfiler
from megarl.observe.progress import ProgressLog
from megarl.observe.report import try_write_report
from megarl.observe.run_files import write_run_files
from megarl.observe.worker_logs import console
from megarl.trainer.roles import RoleGroups, build_roles, enabled_roles, is_writer_process
from megarl.trainer.run_lock import claim


class RunSession:
    def __init__(
        self,
        cfg: MegarlConfig,
        job: str,
        total_steps: int,
        stream: TextIO | None = None,
        roles: RoleGroups | None = None,
    ) -> None:
        """Hold the output directory (megarl.trainer.run_lock: RunDirInUseError when another run has it),
        then find trainer.resume's checkpoint and check it against `job`, the training files and the roles
        `cfg` (resolved) starts; `roles`: groups already started (they are shut down at close like the
        session's own)."""
        self.cfg, self.job, self.total_steps, self.stream = cfg, job, total_steps, stream
        self.output_dir = Path(cfg.trainer.output_dir)
        self.role_names = enabled_roles(cfg)
        self.says = "megarl" if job == RL_JOB else f"megarl {job}"  # how its messages begin
        self.roles = roles
        self.is_writer = roles.is_writer if roles is not None else is_writer_process(cfg)
        self._log: ProgressLog | None = None
        self.began_training = False  # set by the trainer at its first step: the report is due at close
        self._closed = False
        # one run per output directory (megarl.trainer.run_lock): the writer holds it until close
        self._unlock = claim(self.output_dir, self._say) if self.is_writer else None
        try:
            self._check_resume(cfg, job, total_steps)
        except BaseException:
            if self._unlock is not None:  # (groups given as `roles` stay the caller's to stop)
                self._unlock()
                self._unlock = None
            raise

    def _say(self, line: str) -> None:
        print(line, file=self.stream or console(), flush=True)

    def _check_resume(self, cfg: MegarlConfig, job: str, total_steps: int) -> None:
        self.resume_from = resolve_resume(cfg.trainer.resume, self.output_dir)
        self.resumed: dict[str, Any] | None = None  # the checkpoint's trainer state
        self.notes: list[str] = []  # said once the progress log is open
        # the training files' fingerprints, kept in every checkpoint and compared on resume (writer only)
        self.data_files = fingerprint_files(cfg.data.train_files) if self.is_writer else None
        if self.resume_from is not None:
            self.resumed = read_trainer_state(self.resume_from)
            check_job(self.resume_from, self.resumed, job)
            if self.data_files is not None and (
                note := check_data_files(self.resume_from, self.resumed, self.data_files)
            ):
                self.notes.append(f"{self.says}: {note}")
            check_resumable(self.resume_from, self.role_names)
            precheck_roles(self.resume_from, cfg, total_steps, self.role_names)
        self.start_step = self.resumed["step"] if self.resumed is not None else 0

    def start(self) -> RoleGroups:
        """Open the progress log, write the run files, start the worker groups (unless given), and set up
        the profiler and the run's checkpoints. The caller closes the session if this raises."""
        cfg = self.cfg
        resume_step = self.start_step if self.resumed is not None else None
        self._log = ProgressLog.for_run(cfg, self.total_steps, self.is_writer, self.stream, resume_step)
        for note in self.notes:
            self._log.warn(note)
        if cfg.actor.lora.rank > 0 and cfg.actor.backend == "megatron":
            self._log.message(f"{self.says}: {lora_line(cfg)}")
        if self.is_writer:  # config.yaml + run_info.json (machine, layout per role)
            write_run_files(cfg, self.output_dir)
        if self.roles is None:
            with self.log.task(f"starting the worker groups ({', '.join(self.role_names)})"):
                self.roles = build_roles(cfg, self.total_steps)
        self.is_writer = self.roles.is_writer
        trained = {role: getattr(self.roles, role) for role in TRAINED_ROLES}
        trained = {role: group for role, group in trained.items() if group is not None}
        self.profiler = StepProfiler.for_run(cfg, trained, self.is_writer)
        spmd = cfg.trainer.launcher == "torchrun"
        run_state = {"data_files": self.data_files} if self.data_files is not None else None
        self.checkpoints = RunCheckpoints(
            self.output_dir, trained, self.is_writer, cfg.trainer.max_checkpoints, spmd, run_state
        )
        return self.roles

    @property
    def log(self) -> ProgressLog:
        """The run's progress log (console, metrics.jsonl, the backends), open from `start()` on."""
        if self._log is None:
            raise RuntimeError("RunSession.log: call start() first")
        return self._log

    def resume_groups(self) -> None:
        """Load every trained role's checkpoint from `resume_from` (when resuming), then keep aside the
        checkpoints after the start step (another run's future, which this run must not resume into)."""
        if self.resume_from is not None:
            resume_from = self.resume_from
            with self.log.task(f"resuming from {resume_from}"):
                for role, group in self.checkpoints.groups.items():
                    group.load_checkpoint(str(resume_from / role))
        if self.is_writer and (superseded := self.checkpoints.supersede_after(self.start_step)):
            self.log.warn(
                f"{self.says}: checkpoints after step {self.start_step} belong to another run's future; "
                f"kept aside as {', '.join(n + '.superseded' for n in superseded)} in {self.checkpoints.root}"
            )

    def nothing_left(self, done_step: int, exports: bool) -> str | None:
        """What to say when a resumed run is already at (or past) its last step: `fit` then trains
        nothing (and exits 0); `exports`: the model is still written as a Hugging Face checkpoint."""
        if self.resume_from is None or done_step < self.total_steps or done_step > self.start_step:
            return None
        then = "; writing its Hugging Face export" if exports else ""
        return (
            f"{self.says}: {self.resume_from} is at step {done_step} and this run ends at step {self.total_steps} "
            f"(trainer.total_steps or its epochs): nothing left to train{then}. Raise trainer.total_steps to train "
            "further, or start afresh with trainer.resume=disable"
        )

    def retarget(self, total_steps: int) -> None:
        """Make `total_steps` the run's last step (what the progress log counts to)."""
        self.total_steps = total_steps
        if self._log is not None:
            self._log.retarget(total_steps)

    def close(self) -> None:
        """Stop every worker process, flush and close the logging backends, and write the report once
        training began (logging.report); idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.roles is not None:
                self.roles.shutdown()
        finally:
            try:
                if self._log is not None:
                    self._log.close()
                    if self.began_training and self.is_writer and self.cfg.logging.report:
                        try_write_report(self.output_dir, self._log.message)  # never raises
            finally:
                if self._unlock is not None:
                    self._unlock()


class SessionTrainer:
    """What every trainer shares around its RunSession: the step target, `close()` and the context
    manager (`with SFTTrainer(cfg) as trainer: trainer.fit()`)."""

    session: RunSession
    done_step: int  # the last step trained (the resumed checkpoint's at first)

    def step(self) -> Any:
        raise NotImplementedError

    def save_checkpoint(self, step: int) -> dict[str, float]:
        raise NotImplementedError

    def _train_to_target(self) -> None:
        """Run `step()` until the target. A stop signal (SIGTERM/SIGUSR1, megarl.distributed.preemption)
        lets the running step finish within trainer.preempt_grace_s, saves a checkpoint of it and raises
        `Preempted` (exit 75: rerun to resume); a step still running then is abandoned."""
        session = self.session
        spmd = session.cfg.trainer.launcher == "torchrun"
        with PREEMPTION.deferred(session.cfg.trainer.preempt_grace_s):
            try:
                while self.done_step < self.total_steps:
                    self.step()
                    if PREEMPTION.stop_requested(collective=spmd):
                        break
            except BaseException as e:
                if not PREEMPTION.requested or isinstance(e, KeyboardInterrupt):
                    raise
                # the grace ran out, or (torchrun) a peer that gave up broke this rank's collective
                raise Preempted(self._abandoned(), PREEMPTION.signal_name or "", abandoned=True) from None
        if not PREEMPTION.requested:
            return
        step = self.done_step
        if session.checkpoints.saved_step != step and step > session.start_step:
            self.save_checkpoint(step)
        where = session.checkpoints.root / f"step_{step}"
        raise Preempted(
            f"stopped by {PREEMPTION.signal_name} after step {step}: checkpoint {where} saved; rerun the "
            "same command to resume from it (exit code 75)",
            PREEMPTION.signal_name or "",
        )

    def _abandoned(self) -> str:
        checkpoints = self.session.checkpoints.root
        latest = checkpoints / LATEST_FILE
        last = (
            f"the last checkpoint, {checkpoints / latest.read_text().strip()}, stays; rerun the same "
            "command to resume from it (exit code 75)"
            if latest.is_file()
            else "no checkpoint was saved yet: rerunning the same command starts afresh (exit code 75)"
        )
        return (
            f"stopped by {PREEMPTION.signal_name}: step {self.done_step + 1} did not finish within "
            f"trainer.preempt_grace_s={self.session.cfg.trainer.preempt_grace_s:g} and was abandoned; {last}"
        )

    @property
    def total_steps(self) -> int:
        """The step `fit` runs to: trainer.total_steps (or its epochs) until a `fit(total_steps=…)`."""
        return self.session.total_steps

    def close(self) -> None:
        """Stop every worker process, flush and close the logging backends and write the report
        (logging.report, once training began); idempotent."""
        self.session.close()

    def _retarget(self, total_steps: int | None) -> None:
        """`fit(total_steps=…)`: make it the run's last step (not before the last one done)."""
        if total_steps is None:
            return
        if total_steps < self.done_step:
            raise ValueError(f"total_steps={total_steps} is before the last step done ({self.done_step})")
        self.session.retarget(total_steps)

    def _next_step(self) -> int:
        """The step after the last one done; one past the target becomes the target (and so the last)."""
        step = self.done_step + 1
        if step > self.total_steps:
            self.session.retarget(step)
        return step

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lora_line(cfg: MegarlConfig) -> str:
    """What LoRA does in this run, in one console line."""
    from megarl.config.lora_checks import resolve_lora_sync

    lora = cfg.actor.lora
    mode, why = resolve_lora_sync(lora)
    sync = "adapters only (the base once)" if mode == "adapter" else "merged into the base weights"
    ref = "; reference = the actor with its adapters off" if cfg.ref.enable else ""
    targets = ", ".join(lora.target_modules)
    return f"LoRA r={lora.rank} alpha={lora.alpha:g} on {targets}: engine sync {sync} ({why}){ref}"
