"""Controllers: one per model role, each a role's settings plus, once a trainer starts it, its worker group.

    actor = ActorController("models/sft", optimizer=torch.optim.AdamW(params, lr=1e-3), micro_batch_size=32)
    critic = CriticController(optimizer={"lr": 1e-4})          # starts from the actor's checkpoint
    reference = ReferenceController()                          # the actor's starting weights, frozen
    reward = RewardController(function=my_compute_score)       # verl's compute_score signature
    trainer = PPOTrainer(actor=actor, critic=critic, reference=reference, reward=reward, config=cfg)

A controller holds what the config's section for its role would (`model=`, `optimizer=`, `devices=` and
any other key of the section as a keyword: `micro_batch_size=32`, `parallel={"tp": 2}`); a trainer turns
the controllers into config keys (they override the `config`'s, as command-line overrides override a
YAML file) and checks the result exactly as the CLI does. Nothing starts when a controller is made: the
first trainer that uses it starts its worker group, later trainers reuse the running group, and
`close()` (or leaving a `with` block) stops it; the actor's also stops the reference, which lives in its
processes. A trainer's own `close()` leaves the controllers' workers running for the next trainer.

`model=` is a checkpoint directory or an in-memory `transformers.PreTrainedModel`: the trainer writes
it (safetensors) under `<trainer.output_dir>/models/<role>/`, where every rank reads it — the user saves
nothing. Ports (`actor.output`, `reward_model.input`, `critic.values`, ...) name the columns of the stage
each role runs in the step graph; `flow.connect(actor.output, reward_model.input)` checks that they meet.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Self

from megarl.api.optimizers import optimizer_config
from megarl.config.schema import OptimizerConfig
from megarl.errors import EXIT_USAGE, MegarlError
from megarl.protocol import Col
from megarl.trainer.dataflow import Port, Stage, StepContext
from megarl.trainer.scoring import DATASET_COLUMNS, PROMPT_COLUMNS, SEQUENCE_COLUMNS


class ControllerError(MegarlError, ValueError):
    """A controller used in a way it cannot be."""

    exit_code = EXIT_USAGE


ModelSource = str | Path | Any  # a checkpoint directory or a transformers.PreTrainedModel


class Controller:
    """A role's settings and, once started by a trainer, its worker group."""

    role: ClassVar[str]  # the config section: "actor" | "critic" | "ref" | "reward"
    name: str

    def __init__(self, model: ModelSource | None = None, *, devices: Any = None, **settings: Any) -> None:
        self.model = model
        self.devices = devices
        self.settings = settings
        self.group: Any = None  # the started worker group (a typed handle), None until a trainer starts it
        self._owner: Any = None  # what stops the group's processes (RoleGroups or the group itself)
        self.name = type(self).__name__.removesuffix("Controller").lower()

    @property
    def started(self) -> bool:
        return self.group is not None

    def model_path(self, output_dir: Path) -> str | None:
        """The checkpoint directory the ranks read: `model` itself, or where an in-memory model is written."""
        return materialize(self.model, output_dir / "models" / self.name)

    def section(self) -> dict[str, Any]:
        """This controller's keys of its config section (besides the model)."""
        tree = dict(self.settings)
        if self.devices is not None:
            tree.update(_device_keys(self.devices, self.role))
        return tree

    def port(self, stage: str, columns: tuple[str, ...], kind: str, label: str) -> Port:
        return Port(stage=stage, columns=columns, kind=kind, label=f"{self.name}.{label}")  # type: ignore[arg-type]

    def adopt(self, group: Any, owner: Any) -> None:
        """Keep the worker group a trainer started for this role; `owner.shutdown()` stops it."""
        self.group, self._owner = group, owner

    def close(self) -> None:
        """Stop this role's worker processes (idempotent); a later trainer starts them afresh."""
        owner, self.group, self._owner = self._owner, None, None
        if owner is not None:
            owner.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "started" if self.started else "not started"
        return f"{type(self).__name__}(model={_describe(self.model)}, {state})"


BACKENDS = ("megatron", "fsdp")  # <role>.backend: megatron-core, or the transformers model under FSDP2


class _TrainedController(Controller):
    def __init__(
        self,
        model: ModelSource | None = None,
        *,
        optimizer: Any = None,
        devices: Any = None,
        backend: str | None = None,
        **settings: Any,
    ) -> None:
        fsdp_map = getattr(devices, "strategy", None) == "fsdp"
        backend = backend or ("fsdp" if fsdp_map else "megatron")
        if backend not in BACKENDS:
            raise ControllerError(
                f"{type(self).__name__}(backend={backend!r}): use backend='megatron' (megatron-core) or "
                "backend='fsdp' (the transformers model itself, sharded with FSDP2)"
            )
        if fsdp_map and backend != "fsdp":
            raise ControllerError(
                f"{type(self).__name__}(backend={backend!r}, devices=DeviceMap(strategy='fsdp', ...)): the map "
                "runs the role on FSDP; drop backend= or use a DeviceMap of strategy 'megatron'"
            )
        super().__init__(model, devices=devices, **settings)
        self.backend = backend
        self.optimizer: OptimizerConfig | None = None if optimizer is None else optimizer_config(optimizer)

    def section(self) -> dict[str, Any]:
        tree = {"backend": self.backend, **super().section()}
        if self.optimizer is not None:
            from dataclasses import asdict

            tree["optimizer"] = asdict(self.optimizer)
        return tree


class ActorController(_TrainedController):
    """The policy: trained, generating the rollouts (through the HybridEngine), giving log-probs.

    `model=`: the policy checkpoint or a PreTrainedModel; `tokenizer=`: its tokenizer (a directory or a
    PreTrainedTokenizer; default: the checkpoint's own)."""

    role = "actor"

    def __init__(
        self,
        model: ModelSource,
        *,
        tokenizer: Any = None,
        optimizer: Any = None,
        devices: Any = None,
        backend: str | None = None,
        **settings: Any,
    ) -> None:
        if model is None:
            raise ControllerError("ActorController needs model=: a checkpoint directory or a PreTrainedModel")
        super().__init__(model, optimizer=optimizer, devices=devices, backend=backend, **settings)
        self.tokenizer = tokenizer

    def model_path(self, output_dir: Path) -> str | None:
        in_memory = not isinstance(self.model, (str, Path))
        if in_memory and self.tokenizer is None:
            raise ControllerError(
                "ActorController(model=<in-memory model>) needs tokenizer= (a directory or a PreTrainedTokenizer)"
            )
        path = super().model_path(output_dir)
        if self.tokenizer is not None and not isinstance(self.tokenizer, (str, Path)):
            self.tokenizer.save_pretrained(path)  # beside the weights: the workers read it from there
        return path

    def tokenizer_path(self) -> str | None:
        return materialize(self.tokenizer, Path()) if isinstance(self.tokenizer, (str, Path)) else None

    @property
    def input(self) -> Port:
        """The prompts the generate stage reads."""
        return self.port("generate", PROMPT_COLUMNS, "input", "input")

    @property
    def output(self) -> Port:
        """The rollouts the generate stage writes."""
        return self.port("generate", SEQUENCE_COLUMNS, "output", "output")

    @property
    def log_probs(self) -> Port:
        return self.port("old_log_prob", (Col.OLD_LOG_PROBS,), "output", "log_probs")

    @property
    def update(self) -> Port:
        return self.port("update_actor", (Col.ADVANTAGES,), "input", "update")


class CriticController(_TrainedController):
    """The value model of PPO (GAE); `model=None` starts it from the actor's checkpoint (a new value head)."""

    role = "critic"

    @property
    def input(self) -> Port:
        return self.port("values", SEQUENCE_COLUMNS, "input", "input")

    @property
    def values(self) -> Port:
        return self.port("values", (Col.VALUES,), "output", "values")

    output = values


class ReferenceController(Controller):
    """The frozen reference policy (the KL term, DPO): the actor's starting weights, in the actor's
    processes. `model=` is accepted only as the actor's own checkpoint (megarl's reference, like verl's, is
    the policy it starts from)."""

    role = "ref"

    def __init__(self, model: ModelSource | None = None, **settings: Any) -> None:
        super().__init__(model, **settings)
        self.name = "reference"

    @property
    def input(self) -> Port:
        return self.port("ref_log_prob", SEQUENCE_COLUMNS, "input", "input")

    @property
    def log_probs(self) -> Port:
        return self.port("ref_log_prob", (Col.REF_LOG_PROBS,), "output", "log_probs")

    output = log_probs


RewardFunction = Callable[
    ..., Any
]  # verl's compute_score(data_source, solution_str, ground_truth, extra_info)


class RewardController(Controller):
    """One reward term: a reward model (a Megatron scalar-head model, or any transformers sequence
    classifier with backend="hf"), a Python function with verl's `compute_score` signature, or a rule
    reward by name (`rule="gsm8k"`; none of the three: the rule registered for each row's data_source).

    Its score is the batch column `name` (default: "reward_model" for a model, the function's name, the
    rule's name, or "rule"); a trainer sums its reward controllers' columns with their weights and logs
    each as `reward/<name>/mean`. `fit(pairs)` trains a reward model first (Bradley–Terry)."""

    role = "reward"

    def __init__(
        self,
        model: ModelSource | None = None,
        *,
        function: RewardFunction | None = None,
        rule: str | None = None,
        name: str | None = None,
        backend: str = "megatron",
        devices: Any = None,
        **settings: Any,
    ) -> None:
        given = [k for k, v in (("model", model), ("function", function), ("rule", rule)) if v is not None]
        if len(given) > 1:
            raise ControllerError(f"RewardController takes one of model=, function= or rule=; got {given}")
        if function is not None and not callable(function):
            raise ControllerError(f"RewardController(function=...) must be callable, got {function!r}")
        super().__init__(model, devices=devices, **settings)
        self.function, self.rule, self.backend = function, rule, backend
        default = (
            "reward_model" if model is not None else getattr(function, "__name__", None) or rule or "rule"
        )
        self.name = name or default
        if not self.name.isidentifier():
            raise ControllerError(
                f"reward name {self.name!r} must be an identifier (it names a batch column)"
            )

    @property
    def is_model(self) -> bool:
        return self.model is not None

    def section(self) -> dict[str, Any]:
        return {"backend": self.backend, **super().section()}

    def fit(
        self, pairs: Any, config: Any = None, val_pairs: Any = None, **keys: Any
    ) -> list[dict[str, float]]:
        """Train this controller's model with the Bradley–Terry loss on preference `pairs` (held-out
        `val_pairs` give val/rm/accuracy), as `megarl rm` does (`config`: its config, a dict or a YAML
        path; `keys`: dotted keys on top), then score with the exported sequence classifier. Returns the
        steps' metrics."""
        from megarl.api.reward_training import fit_reward_model

        return fit_reward_model(self, pairs, config, val_pairs, **keys)

    @property
    def input(self) -> Port:
        reads = SEQUENCE_COLUMNS if self.is_model else (Col.RESPONSES, Col.RESPONSE_MASK, *DATASET_COLUMNS)
        return self.port(self.name, reads, "input", "input")

    @property
    def output(self) -> Port:
        return self.port(self.name, (self.name,), "output", "output")

    def stage_for(self, method: str) -> Stage:
        """`flow.add_stage(reward.score)`: this controller's scoring stage (writes the column `name`)."""
        if method != "score" or self.scorer is None:
            raise ControllerError(
                f"{self.name}.{method} is not a stage; add {self.name}.score to a flow of a trainer using it"
            )
        return self.scorer

    scorer: Stage | None = None  # set by the trainer that uses this controller

    def score(self, ctx: StepContext, batch: Any) -> Any:
        """This term's score of each row of `batch` (the stage `flow.add_stage(reward.score)` adds)."""
        if self.scorer is None:
            raise ControllerError(f"reward controller {self.name!r} is not used by a trainer yet")
        return self.scorer.fn(ctx, batch)


def materialize(model: ModelSource | None, where: Path) -> str | None:
    """A checkpoint directory for `model`: the path itself, or an in-memory transformers model written
    (safetensors, its config and generation config) to `where` — the same bytes `save_pretrained` gives."""
    if model is None:
        return None
    if isinstance(model, (str, Path)):  # absolute: the worker processes may run in another directory
        return str(Path(model).resolve()) if Path(model).exists() else str(model)
    save = getattr(model, "save_pretrained", None)
    if save is None or not hasattr(model, "config"):
        raise ControllerError(
            f"model={type(model).__name__}: pass a checkpoint directory or a transformers.PreTrainedModel"
        )
    where.mkdir(parents=True, exist_ok=True)
    save(str(where), safe_serialization=True)
    return str(where)


def _device_keys(devices: Any, role: str) -> dict[str, Any]:
    """The config keys a device map sets for a role: `<role>.devices` and `<role>.parallel` (what
    `DeviceMap.apply` writes; the YAML path sets the same keys)."""
    from dataclasses import asdict

    from megarl.controller.device_map import DeviceMap

    if not isinstance(devices, DeviceMap):
        raise ControllerError(
            f"devices={devices!r}: pass a megarl.DeviceMap, e.g. DeviceMap('megatron', ['cuda:0', 'cuda:1'], tp=2)"
        )
    keys: dict[str, Any] = {"devices": list(devices.devices), "parallel": asdict(devices.parallel)}
    if role != "ref":  # the reference has no n_devices: it follows its devices or the actor's
        keys["n_devices"] = None
    return keys


def _describe(model: Any) -> str:
    if model is None or isinstance(model, (str, Path)):
        return repr(str(model) if model is not None else None)
    return type(model).__name__
