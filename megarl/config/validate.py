"""Cross-field checks of a `MegarlConfig`, run once at load time, before any process starts.

`validate` collects every problem and raises one `ConfigError` with one line per problem, each naming
the key, what is wrong and how to fix it. Model-dependent rules (heads, layers, experts) read the
Hugging Face `config.json` under `model.path` and are skipped when `check_paths=False`.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from megarl.algorithms.estimator_traits import CRITIC_ESTIMATORS
from megarl.algorithms.loss_traits import SEQUENCE_MEAN_LOSSES
from megarl.config.agentic_checks import agent_reward_weights, check_multi_turn
from megarl.config.async_checks import check_async
from megarl.config.backend_checks import check_backends
from megarl.config.data_files import DATA_SUFFIXES, directory_problem
from megarl.config.errors import ConfigError, at_least, divisors, in_range, join
from megarl.config.field_checks import check_choices, non_finite_numbers
from megarl.config.lengths import check_sequence_length
from megarl.config.lora_checks import check_lora
from megarl.config.machine import check_machine
from megarl.config.moe_checks import check_moe_router, check_rollout_expert_parallel, check_router_replay
from megarl.config.parallel_checks import ModelDims, check_worker_group, load_dims, read_model_dims
from megarl.config.placement import Placement, check_placement
from megarl.config.schema import MegarlConfig, OptimizerConfig, SamplingConfig
from megarl.config.validate_algorithm import (
    PREFERENCE_ALGORITHMS,
    REFERENCE_ALGORITHMS,
    RL_ALGORITHMS,
    check_algorithm,
    fused_old_log_prob_blockers,
    fused_old_log_prob_problem,
    rollout_log_prob_readers,
)
from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.layout import ParallelLayout
from megarl.output_guard import overlap

__all__ = ["ConfigError", "ModelDims", "read_model_dims", "resolve_auto", "resolve_for_run", "validate"]


def resolve_auto(cfg: MegarlConfig) -> MegarlConfig:
    """`cfg` with every "None = auto" field decided (estimator, loss aggregation, which roles are enabled,
    old log-probs, engine log-probs, the agent's reward weight): `cfg` itself when none is left to decide,
    else a decided copy.

    The fields themselves record the decisions, so resolving a resolved config does nothing (auto runs
    once per config, wherever it is called), and a field set back to None in Python is decided again.
    """
    if all(value is not None for value in _auto_fields(cfg)):
        return cfg
    cfg = copy.deepcopy(cfg)
    algo = cfg.algorithm
    if algo.adv_estimator is None:
        algo.adv_estimator = "grpo" if algo.name == "grpo" else "gae"
    if algo.loss_agg_mode is None:
        algo.loss_agg_mode = (
            "seq-mean-token-mean" if algo.policy_loss in SEQUENCE_MEAN_LOSSES else "token-mean"
        )
    if cfg.critic.enable is None:
        cfg.critic.enable = algo.name in RL_ALGORITHMS and algo.adv_estimator in CRITIC_ESTIMATORS
    if cfg.ref.enable is None:
        cfg.ref.enable = algo.use_kl_in_reward or algo.use_kl_loss or algo.name in REFERENCE_ALGORITHMS
    if cfg.reward.enable is None:
        cfg.reward.enable = cfg.reward.model_path is not None
    if algo.old_log_prob is None:
        algo.old_log_prob = "recompute" if fused_old_log_prob_blockers(cfg) else "fused"
    if cfg.rollout.calculate_log_probs is None:
        cfg.rollout.calculate_log_probs = bool(rollout_log_prob_readers(cfg))
    if (weights := agent_reward_weights(cfg)) is not None:  # env_agent/openai_agent: the agent's reward
        cfg.reward.weights = weights
    return cfg


def _auto_fields(cfg: MegarlConfig) -> tuple[Any, ...]:
    """The values of every field `resolve_auto` decides (None = not decided yet)."""
    algo = cfg.algorithm
    return (
        algo.adv_estimator,
        algo.loss_agg_mode,
        cfg.critic.enable,
        cfg.ref.enable,
        cfg.reward.enable,
        algo.old_log_prob,
        cfg.rollout.calculate_log_probs,
        None if agent_reward_weights(cfg) is not None else True,  # reward.weights.agent_reward
    )


def resolve_for_run(cfg: MegarlConfig) -> MegarlConfig:
    """What the RL trainer runs: `cfg` resolved (`resolve_auto`) and held again to the rule auto's
    old_log_prob decision rests on, so a loaded config edited in Python (algorithm.ppo_epochs=2 under a
    fused old_log_prob) is refused with a ConfigError before any worker starts."""
    cfg = resolve_auto(cfg)
    if problem := fused_old_log_prob_problem(cfg):
        raise ConfigError([problem])
    return cfg


def validate(cfg: MegarlConfig, check_paths: bool = True) -> None:
    """Raise one ConfigError listing every problem in `cfg`; return None when it is valid.

    With `check_paths=False`, files are not looked for, and model-dependent checks and the check of this
    machine's devices (`megarl.config.machine`) are skipped.
    """
    cfg = resolve_auto(cfg)
    problems = non_finite_numbers(cfg)
    stop = bool(problems)  # the rules comparing numbers would blame another key (lr=nan on min_lr)
    check_choices(cfg, problems)
    if stop:
        raise ConfigError(problems)
    if check_paths:  # first: too many ranks is the cause of the batch-split problems it brings
        check_machine(cfg, problems)
    dims = load_dims(cfg, check_paths, problems)
    _check_model(cfg, check_paths, problems)
    _check_trainer(cfg, check_paths, problems)
    _check_export_apart(cfg, problems)
    plan = check_placement(cfg, problems)
    layouts = {
        role: check_worker_group(cfg, role, dims.get("actor" if role == "ref" else role), problems)
        for role in _layout_roles(cfg, plan)
    }
    for role in [*layouts, "ref"] if cfg.ref.enable and "ref" not in layouts else layouts:
        r = getattr(cfg, role)
        _check_batching(cfg, role, r.micro_batch_size, r.max_tokens_per_micro_batch, problems)
    for role in ("actor", "critic") if cfg.critic.enable else ("actor",):
        _check_optimizer(cfg, f"{role}.optimizer", getattr(cfg, role).optimizer, problems)
    _check_rollout(cfg, dims.get("actor"), problems)
    _check_data(cfg, check_paths, problems)
    check_sequence_length(cfg, dims, problems)
    check_algorithm(cfg, problems)
    trained = {r: layout for r, layout in layouts.items() if layout and r in ("actor", "critic")}
    _check_batches(cfg, trained, problems)
    _check_logging(cfg, problems)
    _check_reward_terms(cfg, check_paths, problems)
    _check_torchrun_colocation(cfg, problems)
    check_backends(cfg, problems, check_paths)
    check_lora(cfg, problems, check_paths)
    check_router_replay(cfg, dims.get("actor"), problems)
    check_moe_router(cfg, problems)
    check_rollout_expert_parallel(cfg, dims.get("actor"), problems)
    check_async(cfg, problems)
    check_multi_turn(cfg, problems, check_paths)
    if problems:
        raise ConfigError(problems)


def _layout_roles(cfg: MegarlConfig, plan: Placement | None) -> list[str]:
    """Roles that own a worker group: the reference only on devices of its own (else it lives inside the
    actor's processes; without a plan, when it lists devices other than the actor's)."""
    if plan is not None:
        ref_own = cfg.ref.enable and not plan.ref_in_actor_processes
    else:
        ref_own = bool(cfg.ref.enable) and cfg.ref.devices not in (None, cfg.actor.devices)
    return ["actor"] + [
        r for r in ("ref", "critic", "reward") if getattr(cfg, r).enable and (r != "ref" or ref_own)
    ]


def _check_model(cfg: MegarlConfig, check_paths: bool, problems: list[str]) -> None:
    m = cfg.model
    at_least(problems, "model.make_vocab_size_divisible_by", m.make_vocab_size_divisible_by, 1, "use 128")
    if check_paths and m.tokenizer_path and not os.path.isdir(m.tokenizer_path):
        problems.append(
            f"model.tokenizer_path={m.tokenizer_path} does not exist; fix it or remove it to use model.path"
        )


def _check_batching(
    cfg: MegarlConfig, role: str, micro: int, max_tokens: int | None, problems: list[str]
) -> None:
    at_least(problems, f"{role}.micro_batch_size", micro, 1, "e.g. 1")
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    if max_tokens is not None and max_tokens < seq:
        problems.append(
            f"{role}.max_tokens_per_micro_batch={max_tokens} is smaller than one sequence (data.max_prompt_length"
            f" + data.max_response_length = {seq}); raise it to at least {seq} or set it to null"
        )


def _check_optimizer(cfg: MegarlConfig, key: str, o: OptimizerConfig, problems: list[str]) -> None:
    check_optimizer(key, o, problems)
    total = cfg.trainer.total_steps
    if total is not None and total >= 1 and o.lr_warmup_steps >= total:
        problems.append(
            f"{key}.lr_warmup_steps={o.lr_warmup_steps} is not below trainer.total_steps={total}, so the peak lr is "
            f"never reached; use fewer warm-up steps (e.g. {max(0, total // 10)})"
        )


def check_optimizer(key: str, o: OptimizerConfig, problems: list[str]) -> None:
    """The rules of one OptimizerConfig on its own (its `name` is checked with the other choices)."""
    if o.lr <= 0:
        problems.append(f"{key}.lr={o.lr} must be > 0; e.g. {key}.lr=1e-6")
    elif not 0 <= o.min_lr <= o.lr:
        problems.append(f"{key}.min_lr={o.min_lr} must be in [0, {key}.lr={o.lr}]; e.g. {key}.min_lr=0")
    at_least(problems, f"{key}.weight_decay", o.weight_decay, 0, "e.g. 0.01, or 0 for none")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        problems.append(f"{key}.betas={list(o.betas)} must be two numbers in [0, 1); e.g. [0.9, 0.999]")
    if o.eps <= 0:
        problems.append(f"{key}.eps={o.eps} must be > 0; e.g. 1e-8")
    at_least(problems, f"{key}.clip_grad", o.clip_grad, 0, "e.g. 1.0, or 0 for no clipping")
    at_least(problems, f"{key}.lr_warmup_steps", o.lr_warmup_steps, 0, "e.g. 0")
    if o.name == "sgd":
        in_range(
            problems, f"{key}.momentum", o.momentum, "[0, 1)", 0 <= o.momentum < 1, "e.g. 0.9, or 0 for none"
        )
        if o.use_distributed_optimizer:
            problems.append(
                f"{key}.name=sgd needs {key}.use_distributed_optimizer=false: megatron's distributed optimizer "
                "shards Adam state only"
            )
    elif o.momentum != 0:
        problems.append(
            f"{key}.momentum={o.momentum} is SGD's and {key}.name={o.name} has none; set {key}.name=sgd or "
            f"{key}.momentum=0 (Adam's momentum is {key}.betas[0])"
        )


def _check_rollout(cfg: MegarlConfig, dims: ModelDims | None, problems: list[str]) -> None:
    r = cfg.rollout
    kv_heads = dims.num_key_value_heads if dims else None
    if r.placement == "separate":  # any training layout feeds any engine TP (megarl.distributed.pool_plan)
        if r.tp < 1 or (kv_heads and kv_heads % r.tp):
            problems.append(
                f"rollout.tp={r.tp} must be ≥ 1 and divide the model's {kv_heads} key/value heads (each engine "
                "TP rank holds whole heads)"
            )
    elif cfg.actor.backend == "megatron":  # an FSDP actor's engine groups: megarl.config.backend_checks
        problems += GenerationPlan.check(cfg.actor.parallel, r.tp, kv_heads)
    for key, sampling in (("rollout", r), ("rollout.val", r.val)):
        _check_sampling(key, sampling, problems)
    at_least(problems, "rollout.max_num_seqs", r.max_num_seqs, 1, "e.g. 256")
    ok = 0 < r.gpu_memory_utilization <= 1
    in_range(problems, "rollout.gpu_memory_utilization", r.gpu_memory_utilization, "(0, 1]", ok, "e.g. 0.5")
    if r.kv_cache_memory_bytes is not None:
        at_least(
            problems,
            "rollout.kv_cache_memory_bytes",
            r.kv_cache_memory_bytes,
            1,
            "or null to use the fraction",
        )
    at_least(problems, "rollout.reshard_bucket_mib", r.reshard_bucket_mib, 1, "e.g. 256")


def _check_sampling(key: str, s: SamplingConfig, problems: list[str]) -> None:
    """One generation call's sampling settings: training rollouts' (`rollout`) or evaluation's (`rollout.val`)."""
    at_least(problems, f"{key}.n", s.n, 1, "e.g. 1, or 8 for GRPO" if key == "rollout" else "e.g. 1")
    if at_least(problems, f"{key}.temperature", s.temperature, 0, "e.g. 1.0, or 0 for greedy") and (
        s.temperature == 0 and s.n > 1
    ):
        problems.append(
            f"{key}.temperature=0 (greedy) makes the {key}.n={s.n} samples of a prompt identical; "
            f"set {key}.temperature > 0 (e.g. 1.0) or {key}.n=1"
        )
    in_range(problems, f"{key}.top_p", s.top_p, "(0, 1]", 0 < s.top_p <= 1, "e.g. 1.0 to disable")
    at_least(problems, f"{key}.top_k", s.top_k, -1, "use -1 to disable")
    if s.max_tokens is not None:
        at_least(problems, f"{key}.max_tokens", s.max_tokens, 1, "or null for data.max_response_length")


def _check_data(cfg: MegarlConfig, check_paths: bool, problems: list[str]) -> None:
    d = cfg.data
    if not d.prompt_key:
        problems.append("data.prompt_key is empty; set it to the prompt column, e.g. data.prompt_key=prompt")
    at_least(problems, "data.max_prompt_length", d.max_prompt_length, 1, "e.g. 512 tokens")
    at_least(problems, "data.max_response_length", d.max_response_length, 1, "e.g. 512 tokens")
    at_least(problems, "data.train_batch_size", d.train_batch_size, 1, "e.g. 64 prompts")
    if d.val_batch_size is not None:  # 0 or below would evaluate all of them, or nothing
        at_least(
            problems, "data.val_batch_size", d.val_batch_size, 1, "or null for all of data.val_files at once"
        )
    at_least(problems, "data.seed", d.seed, 0, "e.g. 1")
    if check_paths and not d.train_files:
        problems.append("data.train_files is empty; set data.train_files=[path/to/train.parquet]")
    for name in ("train_files", "val_files"):
        for i, path in enumerate(getattr(d, name)):
            key = f"data.{name}[{i}]={path}"
            if not path.endswith(DATA_SUFFIXES):
                problems.append(f"{key} has an unsupported format; use a {', '.join(DATA_SUFFIXES)} file")
            elif check_paths and (directory := directory_problem(path)):
                problems.append(f"{key} {directory}")
            elif check_paths and not os.path.isfile(path):
                problems.append(f"{key} does not exist; fix the path or create the dataset first")


def _check_batches(cfg: MegarlConfig, layouts: dict[str, ParallelLayout], problems: list[str]) -> None:
    """Prompts → mini-batches → data-parallel ranks → micro-batches must all split evenly."""
    train, mini, n = cfg.data.train_batch_size, cfg.algorithm.ppo_mini_batch_size, cfg.rollout.n
    if cfg.algorithm.name in ("sft", "rm", *PREFERENCE_ALGORITHMS):  # one optimizer step per batch
        mini, n = train, 1
    if train < 1 or mini < 1 or n < 1:
        return
    if mini > train:
        problems.append(
            f"algorithm.ppo_mini_batch_size={mini} exceeds data.train_batch_size={train}; "
            f"use one of {join(divisors(train))}"
        )
    elif train % mini:
        problems.append(
            f"algorithm.ppo_mini_batch_size={mini} does not divide data.train_batch_size={train}; "
            f"use one of {join(divisors(train))}"
        )
    for role, layout in layouts.items():
        dp, r = layout.dp, getattr(cfg, role)
        if role == "actor" and train % dp:
            problems.append(
                f"data.train_batch_size={train} is not a multiple of the actor's data-parallel size {dp}; "
                f"use a multiple of {dp}, e.g. {dp * max(1, round(train / dp))}"
            )
        if (mini * n) % dp:
            problems.append(
                f"algorithm.ppo_mini_batch_size·rollout.n = {mini}·{n} sequences do not split over the {role}'s "
                f"{dp} data-parallel ranks; make ppo_mini_batch_size·rollout.n a multiple of {dp}"
            )
        elif (
            r.max_tokens_per_micro_batch is None
            and r.micro_batch_size >= 1
            and (mini * n // dp) % r.micro_batch_size
        ):
            per_rank = mini * n // dp
            problems.append(
                f"{role}.micro_batch_size={r.micro_batch_size} does not divide the {per_rank} sequences each {role} "
                f"data-parallel rank gets per mini-batch (ppo_mini_batch_size·rollout.n/DP = {mini}·{n}/{dp}); "
                f"use one of {join(divisors(per_rank))}"
            )


def _check_torchrun_colocation(cfg: MegarlConfig, problems: list[str]) -> None:
    """Under torchrun every role is a worker in each process, and megatron has one layout per process."""
    if cfg.trainer.launcher != "torchrun":
        return
    roles = [r for r in ("critic", "reward") if getattr(cfg, r).enable]
    for role in roles:
        if role == "reward" and cfg.reward.backend != "megatron":
            continue  # plain PyTorch data parallelism: no megatron layout
        if getattr(cfg, role).parallel != cfg.actor.parallel:
            problems.append(
                f"{role}.parallel differs from actor.parallel; under trainer.launcher=torchrun every role runs "
                f"in the actor's processes with the actor's layout: set {role}.parallel to the actor's or use "
                "trainer.launcher=ray"
            )


def _check_trainer(cfg: MegarlConfig, check_paths: bool, problems: list[str]) -> None:
    t = cfg.trainer
    at_least(problems, "trainer.nnodes", t.nnodes, 1, "e.g. 1")
    at_least(
        problems, "trainer.n_devices_per_node", t.n_devices_per_node, 1, "e.g. 8 GPUs (or CPU processes)"
    )
    at_least(problems, "trainer.total_epochs", t.total_epochs, 1, "e.g. 1")
    if t.total_steps is not None:
        at_least(problems, "trainer.total_steps", t.total_steps, 1, "or null to run total_epochs")
    at_least(
        problems, "trainer.save_every", t.save_every, -1, "use 0 to save only at the end, -1 to never save"
    )
    if t.max_checkpoints is not None:
        at_least(problems, "trainer.max_checkpoints", t.max_checkpoints, 1, "or null to keep all")
    if at_least(problems, "trainer.eval_every", t.eval_every, 0, "use 0 to never evaluate"):
        if t.eval_every > 0 and not cfg.data.val_files:
            problems.append(
                f"trainer.eval_every={t.eval_every} but data.val_files is empty; "
                "set data.val_files=[path/to/val.parquet] or trainer.eval_every=0"
            )
    if t.val_only and not cfg.data.val_files:
        problems.append(
            "trainer.val_only=true but data.val_files is empty; set data.val_files=[path/to/val.parquet]"
        )
    if not t.output_dir:
        problems.append("trainer.output_dir is empty; set it, e.g. trainer.output_dir=outputs/my_run")
    if not t.resume:
        problems.append("trainer.resume is empty; use auto, disable or a checkpoint directory")
    elif t.resume not in ("auto", "disable") and check_paths and not os.path.isdir(t.resume):
        problems.append(
            f"trainer.resume={t.resume} is neither auto, disable nor an existing checkpoint directory; "
            "fix the path or use trainer.resume=auto"
        )
    in_range(problems, "trainer.seed", t.seed, "[0, 2**32)", 0 <= t.seed < 2**32, "e.g. 42")
    if not t.worker_timeout_s > 0:
        problems.append(
            f"trainer.worker_timeout_s={t.worker_timeout_s} must be > 0: it bounds every worker call and "
            "collective; use e.g. 1800 (30 min), more for long generations or checkpoint saves"
        )
    at_least(problems, "trainer.max_bad_steps", t.max_bad_steps, 1, "e.g. 3 (steps in a row with NaN/inf)")
    if t.preempt_grace_s < 0:  # NaN/inf: megarl.config.field_checks
        problems.append(
            f"trainer.preempt_grace_s={t.preempt_grace_s} must be a number of seconds ≥ 0: how long the "
            "running step may take after SIGTERM/SIGUSR1; use e.g. 60 (0 = abandon it at once)"
        )
    _check_profiling(cfg, problems)


def _check_export_apart(cfg: MegarlConfig, problems: list[str]) -> None:
    """The HF export (`<output_dir>/hf`: trainer.save_hf, or every sft/preference/rm run) would replace a
    model the run reads: refused before anything is written."""
    if not cfg.trainer.output_dir or not (cfg.trainer.save_hf or cfg.algorithm.name not in RL_ALGORITHMS):
        return
    export = os.path.join(cfg.trainer.output_dir, "hf")
    why = "trainer.save_hf=true writes" if cfg.algorithm.name in RL_ALGORITHMS else "this job writes"
    inputs = {
        "model.path": cfg.model.path,
        "model.tokenizer_path": cfg.model.tokenizer_path,
        "critic.model_path": cfg.critic.model_path,
        "reward.model_path": cfg.reward.model_path,
    }
    for key, path in inputs.items():
        if path and (how := overlap(export, path)):
            problems.append(
                f"{why} the Hugging Face model to {export}, which {how} {key}={path}: the export would "
                f"overwrite the model it starts from; set trainer.output_dir to another directory (or copy "
                "the model elsewhere first)"
            )


def _check_profiling(cfg: MegarlConfig, problems: list[str]) -> None:
    t = cfg.trainer
    last = t.total_steps
    outside = [s for s in t.profile_steps if s < 1 or (last is not None and s > last)]
    if outside:
        steps = f"1..{last} (trainer.total_steps)" if last is not None else "≥ 1"
        problems.append(
            f"trainer.profile_steps={t.profile_steps} has {join(outside)} outside {steps}; "
            "list steps in that range, e.g. [2]"
        )
    world = max(cfg.world_size(role) for role in ("actor", "critic") if role == "actor" or cfg.critic.enable)
    if world < 1:  # no devices (the device checks say so)
        return
    outside = [r for r in t.profile_ranks if not 0 <= r < world]
    if outside:
        problems.append(
            f"trainer.profile_ranks={t.profile_ranks} has {join(outside)} outside 0..{world - 1} "
            f"(the profiled worker groups have {world} rank{'s' if world > 1 else ''}); e.g. [0]"
        )


def _check_logging(cfg: MegarlConfig, problems: list[str]) -> None:
    lg = cfg.logging
    duplicates = sorted({b for b in lg.backends if lg.backends.count(b) > 1})
    if duplicates:
        problems.append(f"logging.backends lists {join(duplicates)} more than once; list each backend once")
    if not lg.project:
        problems.append("logging.project is empty; set it, e.g. logging.project=megarl")
    at_least(problems, "logging.log_every", lg.log_every, 1, "e.g. 1")


def _check_reward_terms(cfg: MegarlConfig, check_paths: bool, problems: list[str]) -> None:
    """reward.function, reward.weights and reward.overlong_buffer (megarl.rewards reads them)."""
    import math

    r = cfg.reward
    fn = r.function
    if fn.path is not None:
        if not fn.path.endswith(".py"):
            problems.append(f"reward.function.path={fn.path} is not a .py file; point it at the reward file")
        elif check_paths and not os.path.isfile(fn.path):
            problems.append(f"reward.function.path={fn.path} does not exist; fix the path or remove it")
        if not fn.name:
            problems.append(
                "reward.function.name is empty; set it to the function's name, e.g. compute_score"
            )
    for name, weight in r.weights.items():
        if not math.isfinite(weight) or weight < 0:
            problems.append(
                f"reward.weights.{name}={weight} must be a number ≥ 0; use 0 to switch the term off"
            )
    if r.weights.get("rm", 0) > 0 and not r.enable:
        problems.append(
            f"reward.weights.rm={r.weights['rm']} but the reward model is off; set reward.model_path=... "
            "or remove reward.weights.rm"
        )
    ob = r.overlong_buffer
    if ob.enable:
        limit = cfg.rollout.max_tokens or cfg.data.max_response_length
        if not 1 <= ob.len <= limit:
            problems.append(
                f"reward.overlong_buffer.len={ob.len} must be in [1, {limit}] (the response limit) when "
                f"reward.overlong_buffer.enable=true; e.g. reward.overlong_buffer.len={max(1, limit // 4)}"
            )
        at_least(problems, "reward.overlong_buffer.penalty_factor", ob.penalty_factor, 0, "e.g. 1.0")
    if not (math.isfinite(r.timeout_s) and r.timeout_s >= 0):
        problems.append(
            f"reward.timeout_s={r.timeout_s} must be a number of seconds ≥ 0 (0 = no limit); e.g. 10"
        )
    if not 0 <= r.max_error_fraction <= 1:  # also false for nan
        problems.append(
            f"reward.max_error_fraction={r.max_error_fraction} must be in [0, 1]; e.g. 0.5 (1 = stop only when "
            "every row of a step fails)"
        )
    if r.workers is not None and r.workers < 0:
        problems.append(f"reward.workers={r.workers} must be ≥ 0 (0 = in the driver process); e.g. 2")
