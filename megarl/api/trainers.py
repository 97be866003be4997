"""PPOTrainer and GRPOTrainer: the RL trainer built from controllers (megarl.api.controllers).

    trainer = PPOTrainer(actor=actor, critic=critic, reference=reference, reward=reward,
                         config="run.yaml", overrides={"trainer.total_steps": 20})
    metrics = trainer.step()                      # one step: its metrics
    trainer.set_reward_controller(harder)         # a curriculum: the next steps score with `harder`
    trainer.set_multi_reward_controllers([(exact, 1.0), (short, 0.2)])   # weighted; call again to re-weight
    trainer.add_preference_update("pairs.parquet", loss="dpo", weight=0.5)  # DPO+PPO: both updates a step
    history = trainer.fit()                       # to trainer.total_steps, with progress
    trainer.close()                               # the controllers' workers keep running: controller.close()

These ARE `RLTrainer`s: the controllers become config keys (overriding `config`'s — a dict, a MegarlConfig
or a YAML path — as command-line overrides override a YAML file), checked with the CLI's messages; the
run's logging, checkpoints and resume are the CLI's. What differs: the reward is the sum of the reward
controllers' columns (one stage each, see megarl.api.rewards), and the worker groups belong to the
controllers, so a later trainer can reuse them (the actor after an RM or a DPO run, for instance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TextIO

from megarl.api.controllers import (
    ActorController,
    Controller,
    ControllerError,
    CriticController,
    ReferenceController,
    RewardController,
)
from megarl.api.flow import Dataflow
from megarl.api.rewards import Weighted, score_stage, sum_computer, weighted
from megarl.config.load import config_from, config_tree
from megarl.trainer.rl_trainer import RLTrainer
from megarl.trainer.roles import RoleGroups
from megarl.trainer.scoring import reward_stage


@dataclass
class Roles:
    """The controllers of one trainer: `PPOTrainer(roles=Roles(actor=..., reward_models=[rm1, rm2]))`.
    `reward_models`: RewardControllers, or (RewardController, weight) pairs."""

    actor: ActorController
    critic: CriticController | None = None
    reference: ReferenceController | None = None
    reward_models: list[Any] = field(default_factory=list)


class ControllerTrainer(RLTrainer):
    """What PPOTrainer and GRPOTrainer share; see the module doc."""

    flow_class = Dataflow
    flow: Dataflow
    algorithm: ClassVar[dict[str, Any]]

    def __init__(
        self,
        actor: ActorController | None = None,
        critic: CriticController | None = None,
        reference: ReferenceController | None = None,
        reward: Any = None,
        config: Any = None,
        *,
        roles: Roles | None = None,
        overrides: Sequence[str] | dict[str, Any] = (),
        stream: TextIO | None = None,
    ) -> None:
        roles = roles or Roles(actor, critic, reference)  # type: ignore[arg-type]
        if roles.actor is None:
            raise ControllerError(f"{type(self).__name__} needs actor=ActorController(...)")
        _check_kinds(roles)
        self._check_roles(roles)
        self.controllers = roles
        rewards = weighted(reward if reward is not None else roles.reward_models or None)
        output_dir = Path(output_dir_of(config, overrides))
        running = _running_groups(roles)
        settings = _settings(roles, output_dir, self.algorithm, running)
        if isinstance(overrides, dict):  # {"trainer.total_steps": 5}: applied last, like dotlist overrides
            settings, overrides = [*settings, overrides], ()
        cfg = config_from(config, settings, overrides)
        cfg.trainer.output_dir = str(Path(cfg.trainer.output_dir).resolve())  # the workers run elsewhere
        super().__init__(cfg, roles=running, reward=sum_computer(cfg, None, rewards), stream=stream)
        try:
            self._adopt(roles)
            self.rewards: list[tuple[RewardController, float]] = []
            self._install_rewards(rewards)
            self.flow.trainer = self
        except BaseException:
            self.close()
            raise

    def _check_roles(self, roles: Roles) -> None:
        """The roles this algorithm needs or refuses."""

    def remap(self, role: str, target: Any) -> dict[str, Any]:
        """`RLTrainer.remap`, and the role's controller records where its group now runs (a later trainer
        given this controller finds the group at the new layout): its `devices` become the new map."""
        from megarl.controller.device_map import DeviceMap

        report = super().remap(role, target)
        controller = {"actor": self.controllers.actor, "critic": self.controllers.critic}[role]
        section = getattr(self.cfg, role)
        if controller is not None and section.devices is not None:
            fsdp = self.cfg.backend_of(role) == "fsdp"  # FSDP shards over its devices: no layout keys
            layout = {} if fsdp else vars(section.parallel)
            controller.devices = DeviceMap("fsdp" if fsdp else "megatron", section.devices, **layout)
        elif controller is not None:
            controller.settings["parallel"] = dict(vars(section.parallel))
        return report

    # ---- rewards -------------------------------------------------------------------------------------

    def set_reward_controller(self, reward: RewardController) -> None:
        """Score the next steps with `reward` alone (a curriculum: switch at any step)."""
        self.set_multi_reward_controllers([(reward, 1.0)])

    def set_multi_reward_controllers(self, rewards: Weighted) -> None:
        """Score the next steps with the weighted sum of these controllers' scores; call again with other
        weights to re-weight (controllers already scoring keep their stage and their workers)."""
        self._install_rewards(weighted(list(rewards)))

    @property
    def reward_weights(self) -> dict[str, float]:
        return {rc.name: w for rc, w in self.rewards}

    def _install_rewards(self, rewards: list[tuple[RewardController, float]]) -> None:
        flow, old = self.flow, {rc.name: rc for rc, _ in self.rewards}
        keep = {rc.name for rc, _ in rewards if old.get(rc.name) is rc}
        stages = {}
        for rc, _ in rewards:
            if rc.name not in keep:
                stages[rc.name] = score_stage(
                    rc, self.cfg, self.tokenizer, self.train_data.data_sources, self.roles.pools
                )
        for name in set(old) - keep:
            flow.remove(name)
        self.reward = sum_computer(self.cfg, self.tokenizer, rewards)
        flow.replace("reward", reward_stage(self.reward, with_rm=False))
        for rc, _ in rewards:
            if rc.name in stages:
                flow.insert_before("reward", stages[rc.name])
        self.rewards = rewards
        flow.check()

    # ---- other updates in the same step ---------------------------------------------------------------

    def add_preference_update(
        self, pairs: Any, loss: str = "dpo", weight: float = 0.5, **settings: Any
    ) -> Any:
        """End every step with a preference update (DPO/IPO/ORPO/SimPO, `weight` × its loss) on pairs
        from `pairs`, after the PPO update: DPO+PPO in one flow. `settings`: beta, batch_size,
        label_smoothing, simpo_gamma (megarl.trainer.preference_stage.add_preference_update)."""
        from megarl.trainer.preference_stage import add_preference_update

        return add_preference_update(self, pairs, loss=loss, weight=weight, **settings)

    # ---- flow.run -----------------------------------------------------------------------------------

    def run_for(self, steps: int | None = None, num_epochs: int | None = None) -> list[dict[str, float]]:
        """`flow.run(steps=N)` / `flow.run(num_epochs=N)`: N more steps (or epochs of the prompts);
        returns those steps' metrics."""
        if (steps is None) == (num_epochs is None):
            raise ControllerError("flow.run takes one of steps= or num_epochs=")
        more = steps if steps is not None else num_epochs * self.loader.steps_per_epoch  # type: ignore[operator]
        if more < 1:
            raise ControllerError(f"flow.run: steps={more}; run at least one step")
        done = self.done_step
        history = self.fit(total_steps=done + more)
        return [h for h in history if h["step"] > done]

    # ---- the controllers' groups --------------------------------------------------------------------

    def _adopt(self, roles: Roles) -> None:
        """Hand the groups this trainer started to their controllers, which stop them at close()."""
        groups = self.roles
        given = {"actor": roles.actor, "critic": roles.critic, "ref": roles.reference}
        detached = set(groups.detached)
        for attr, controller in given.items():
            group = getattr(groups, attr)
            if controller is None or controller.started or group is None:
                continue
            if attr == "ref":  # in the actor's processes: stopped with the actor
                controller.adopt(group, None)
                continue
            controller.adopt(group, _RoleStopper(groups, attr))
            detached.add(attr)
        groups.detached = frozenset(detached)


class PPOTrainer(ControllerTrainer):
    """PPO with a critic (GAE advantages): `PPOTrainer(actor=, critic=, reference=, reward=, config=)`."""

    algorithm = {"name": "ppo", "adv_estimator": "gae"}

    def _check_roles(self, roles: Roles) -> None:
        if roles.critic is None:
            raise ControllerError(
                "PPOTrainer needs critic=CriticController(...) (GAE advantages); without a critic use GRPOTrainer"
            )


class GRPOTrainer(ControllerTrainer):
    """GRPO (group-relative advantages, no critic): `GRPOTrainer(actor=, reference=, reward=, config=)`."""

    algorithm = {"name": "grpo", "adv_estimator": "grpo"}

    def _check_roles(self, roles: Roles) -> None:
        if roles.critic is not None:
            raise ControllerError(
                "GRPOTrainer uses no critic (group-relative advantages); for GAE use PPOTrainer"
            )


class _RoleStopper:
    def __init__(self, groups: RoleGroups, attr: str) -> None:
        self.groups, self.attr = groups, attr

    def shutdown(self) -> None:
        self.groups.stop(self.attr)


def _check_kinds(roles: Roles) -> None:
    expected = {
        "actor": ActorController,
        "critic": CriticController,
        "reference": ReferenceController,
    }
    for attr, cls in expected.items():
        value = getattr(roles, attr)
        if value is not None and not isinstance(value, cls):
            raise ControllerError(f"{attr}={value!r}: pass a {cls.__name__}")


def _running_groups(roles: Roles) -> RoleGroups | None:
    """The groups of controllers an earlier trainer started (None: this trainer starts them all)."""
    given: dict[str, Controller | None] = {"actor": roles.actor, "critic": roles.critic}
    started = [name for name, c in given.items() if c is not None and c.started]
    if not started:
        if roles.reference is not None and roles.reference.started:
            raise ControllerError("the reference is running in another actor's processes; pass that actor")
        return None
    missing = [name for name, c in given.items() if c is not None and not c.started]
    if missing:
        raise ControllerError(
            f"{', '.join(started)} are running (an earlier trainer started them) but {', '.join(missing)} "
            "are not: a trainer starts all its roles or none; close() the running ones or pass controllers "
            "started together"
        )
    ref = roles.reference.group if roles.reference is not None else None
    if roles.reference is not None and ref is None:
        raise ControllerError("the actor is running without a reference; start them together")
    return RoleGroups(
        actor=roles.actor.group,
        ref=ref,
        critic=roles.critic.group if roles.critic is not None else None,
        detached=frozenset(started),
    )


def _settings(roles: Roles, output_dir: Path, algorithm: dict, running: RoleGroups | None) -> list[dict]:
    """The config keys the controllers set."""
    actor = roles.actor
    model: dict[str, Any] = {"path": actor.model_path(output_dir)}
    if actor.tokenizer_path() is not None:
        model["tokenizer_path"] = actor.tokenizer_path()
    critic: dict[str, Any] = {"enable": roles.critic is not None}
    if roles.critic is not None:
        critic.update(roles.critic.section())
        if (path := roles.critic.model_path(output_dir)) is not None:
            critic["model_path"] = path
    ref: dict[str, Any] = {}
    if roles.reference is not None:
        if roles.reference.model is not None and str(roles.reference.model) != model["path"]:
            raise ControllerError(
                "ReferenceController(model=...) must be the actor's checkpoint: megarl's reference is the "
                "policy the actor starts from (leave model= unset)"
            )
        ref = {"enable": True, **roles.reference.section()}
    elif running is not None:
        ref = {"enable": running.ref is not None}
    return [
        {"model": model, "actor": actor.section(), "critic": critic, "algorithm": algorithm},
        {"ref": ref} if ref else {},
        {"reward": {"enable": False}},  # the reward controllers' stages score (megarl.api.rewards)
    ]


def output_dir_of(
    config: Any, overrides: Sequence[str] | dict[str, Any], default: str = "outputs/run"
) -> str:
    """trainer.output_dir as the config will have it (in-memory models are written below it)."""
    if isinstance(overrides, dict):
        tree = config_tree(overrides)
        if "output_dir" in tree.get("trainer", {}):
            return str(tree["trainer"]["output_dir"])
        overrides = ()
    for item in reversed(list(overrides)):
        key, _, value = item.partition("=")
        if key.strip() == "trainer.output_dir":
            return value.strip()
    tree = config_tree(config)
    return str(tree.get("trainer", {}).get("output_dir") or default)
