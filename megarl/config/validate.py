"""Cross-field checks of a `MegarlConfig`, run once at load time, before any process starts.

`validate` collects every problem and raises one `ConfigError` with one line per problem, each naming
the key, what is wrong and how to fix it. Model-dependent rules (heads, layers, experts) read the
Hugging Face `config.json` under `model.path` and are skipped when `check_paths=False`.
"""

from __future__ import annotations

import copy
import os
import typing
from dataclasses import fields, is_dataclass
from typing import Any, Literal

from megarl.algorithms.estimator_traits import CRITIC_ESTIMATORS, ESTIMATOR_TRAITS, GROUP_ESTIMATORS
from megarl.algorithms.loss_traits import LOSS_PARAMS, SEQUENCE_MEAN_LOSSES
from megarl.config.errors import ConfigError, at_least, divisors, in_range, join
from megarl.config.parallel_checks import ModelDims, check_worker_group, load_dims, read_model_dims
from megarl.config.schema import MegarlConfig, OptimizerConfig
from megarl.distributed.generation_plan import GenerationPlan
from megarl.distributed.layout import ParallelLayout

__all__ = ["ConfigError", "ModelDims", "read_model_dims", "resolve_auto", "validate"]

_GRPO_ESTIMATORS = ("grpo", "drgrpo")  # what algorithm.name=grpo allows
_RL_ALGORITHMS = ("ppo", "grpo")
_DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def resolve_auto(cfg: MegarlConfig) -> MegarlConfig:
    """A copy of `cfg` with every "None = auto" field decided (estimator, which roles are enabled)."""
    cfg = copy.deepcopy(cfg)
    algo = cfg.algorithm
    if algo.adv_estimator is None:
        algo.adv_estimator = "grpo" if algo.name == "grpo" else "gae"
    if algo.loss_agg_mode is None:
        algo.loss_agg_mode = (
            "seq-mean-token-mean" if algo.policy_loss in SEQUENCE_MEAN_LOSSES else "token-mean"
        )
    if cfg.critic.enable is None:
        cfg.critic.enable = algo.name in _RL_ALGORITHMS and algo.adv_estimator in CRITIC_ESTIMATORS
    if cfg.ref.enable is None:
        cfg.ref.enable = algo.use_kl_in_reward or algo.use_kl_loss or algo.name == "dpo"
    if cfg.reward.enable is None:
        cfg.reward.enable = cfg.reward.model_path is not None
    return cfg


def validate(cfg: MegarlConfig, check_paths: bool = True) -> None:
    """Raise one ConfigError listing every problem in `cfg`; return None when it is valid.

    With `check_paths=False`, files are not looked for and model-dependent checks are skipped.
    """
    cfg = resolve_auto(cfg)
    problems: list[str] = []
    _check_choices(cfg, "", problems)
    dims = load_dims(cfg, check_paths, problems)
    _check_model(cfg, check_paths, problems)
    _check_trainer(cfg, check_paths, problems)
    layouts = {role: check_worker_group(cfg, role, dims.get(role), problems) for role in _layout_roles(cfg)}
    for role in [*layouts, "ref"] if cfg.ref.enable else layouts:
        r = getattr(cfg, role)
        _check_batching(cfg, role, r.micro_batch_size, r.max_tokens_per_micro_batch, problems)
    for role in ("actor", "critic") if cfg.critic.enable else ("actor",):
        _check_optimizer(cfg, f"{role}.optimizer", getattr(cfg, role).optimizer, problems)
    _check_rollout(cfg, dims.get("actor"), problems)
    _check_data(cfg, check_paths, problems)
    _check_algorithm(cfg, problems)
    trained = {r: layout for r, layout in layouts.items() if layout and r in ("actor", "critic")}
    _check_batches(cfg, trained, problems)
    _check_logging(cfg, problems)
    _check_reward_terms(cfg, check_paths, problems)
    _check_torchrun_colocation(cfg, problems)
    if problems:
        raise ConfigError(problems)


def _layout_roles(cfg: MegarlConfig) -> list[str]:
    """Roles that own a worker group (the reference lives inside the actor's)."""
    return ["actor"] + [role for role in ("critic", "reward") if getattr(cfg, role).enable]


def _choices_of(tp: Any) -> tuple[tuple[Any, ...], bool]:
    """(allowed values, is_list) of a Literal / Literal | None / list[Literal] type; () when not a choice."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return typing.get_args(tp), False
    if origin is list:
        return _choices_of(typing.get_args(tp)[0])[0], True
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg), False
    return (), False


def _check_choices(obj: Any, prefix: str, problems: list[str]) -> None:
    """Every Literal-typed field holds an allowed value (configs built in Python skip omegaconf's check)."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value, key = getattr(obj, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            _check_choices(value, f"{key}.", problems)
            continue
        allowed, is_list = _choices_of(hints[f.name])
        if not allowed or value is None:
            continue
        for item in value if is_list else [value]:
            if item not in allowed:
                where = f"{key} contains {item!r}" if is_list else f"{key}={item!r}"
                problems.append(f"{where}, which is not allowed; use one of {join(allowed)}")


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
    total = cfg.trainer.total_steps
    if total is not None and total >= 1 and o.lr_warmup_steps >= total:
        problems.append(
            f"{key}.lr_warmup_steps={o.lr_warmup_steps} is not below trainer.total_steps={total}, so the peak lr is "
            f"never reached; use fewer warm-up steps (e.g. {max(0, total // 10)})"
        )


def _check_rollout(cfg: MegarlConfig, dims: ModelDims | None, problems: list[str]) -> None:
    r = cfg.rollout
    problems += GenerationPlan.check(cfg.actor.parallel, r.tp, dims.num_key_value_heads if dims else None)
    at_least(problems, "rollout.n", r.n, 1, "e.g. 1, or 8 for GRPO")
    if (
        at_least(problems, "rollout.temperature", r.temperature, 0, "e.g. 1.0")
        and r.temperature == 0
        and r.n > 1
    ):
        problems.append(
            f"rollout.temperature=0 (greedy) makes the rollout.n={r.n} samples of a prompt identical; "
            "set rollout.temperature > 0 (e.g. 1.0) or rollout.n=1"
        )
    in_range(problems, "rollout.top_p", r.top_p, "(0, 1]", 0 < r.top_p <= 1, "e.g. 1.0 to disable")
    at_least(problems, "rollout.top_k", r.top_k, -1, "use -1 to disable")
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
    for key, sampling in (("rollout", r), ("rollout.val", r.val)):
        if sampling.max_tokens is not None:
            at_least(
                problems, f"{key}.max_tokens", sampling.max_tokens, 1, "or null for data.max_response_length"
            )


def _check_data(cfg: MegarlConfig, check_paths: bool, problems: list[str]) -> None:
    d = cfg.data
    if not d.prompt_key:
        problems.append("data.prompt_key is empty; set it to the prompt column, e.g. data.prompt_key=prompt")
    at_least(problems, "data.max_prompt_length", d.max_prompt_length, 1, "e.g. 512 tokens")
    at_least(problems, "data.max_response_length", d.max_response_length, 1, "e.g. 512 tokens")
    at_least(problems, "data.train_batch_size", d.train_batch_size, 1, "e.g. 64 prompts")
    at_least(problems, "data.seed", d.seed, 0, "e.g. 1")
    if check_paths and not d.train_files:
        problems.append("data.train_files is empty; set data.train_files=[path/to/train.parquet]")
    for name in ("train_files", "val_files"):
        for i, path in enumerate(getattr(d, name)):
            key = f"data.{name}[{i}]={path}"
            if not path.endswith(_DATA_SUFFIXES):
                problems.append(f"{key} has an unsupported format; use a {', '.join(_DATA_SUFFIXES)} file")
            elif check_paths and not os.path.isfile(path):
                problems.append(f"{key} does not exist; fix the path or create the dataset first")


def _check_algorithm(cfg: MegarlConfig, problems: list[str]) -> None:
    a = cfg.algorithm
    val = cfg.rollout.val
    if a.adv_estimator == "remax" and (val.n != 1 or val.temperature != 0):
        problems.append(
            f"algorithm.adv_estimator=remax takes its baseline from the greedy response (rollout.val sampling), "
            f"but rollout.val.n={val.n}, rollout.val.temperature={val.temperature}; set rollout.val.n=1 and "
            "rollout.val.temperature=0"
        )
    if a.filter_groups.enable:
        at_least(
            problems,
            "algorithm.filter_groups.max_num_gen_batches",
            a.filter_groups.max_num_gen_batches,
            1,
            "e.g. 10",
        )
        if cfg.rollout.n < 2:
            problems.append(
                f"algorithm.filter_groups.enable=true compares the samples of a prompt, but rollout.n={cfg.rollout.n}; "
                "set rollout.n >= 2 (e.g. 8) or algorithm.filter_groups.enable=false"
            )
    if a.name == "grpo" and a.adv_estimator not in _GRPO_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} contradicts algorithm.name=grpo (which uses "
            f"{' or '.join(_GRPO_ESTIMATORS)}); remove adv_estimator or set algorithm.name=ppo"
        )
    if a.name in _RL_ALGORITHMS and a.adv_estimator in CRITIC_ESTIMATORS and not cfg.critic.enable:
        problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} needs a value model but critic.enable=false; "
            "set critic.enable=true or use a critic-free estimator: algorithm.adv_estimator=grpo, drgrpo, "
            "rloo, reinforce_plus_plus, reinforce_plus_plus_baseline or remax"
        )
    if a.name in _RL_ALGORITHMS and a.adv_estimator in GROUP_ESTIMATORS and cfg.rollout.n < 2:
        problems.append(
            f"rollout.n={cfg.rollout.n} but algorithm.adv_estimator={a.adv_estimator} compares the samples of "
            "each prompt; set rollout.n ≥ 2 (e.g. 8)"
        )
    for flag in ("use_kl_in_reward", "use_kl_loss"):
        if getattr(a, flag) and not cfg.ref.enable:
            problems.append(
                f"algorithm.{flag}=true needs the reference model but ref.enable=false; "
                f"set ref.enable=true or algorithm.{flag}=false"
            )
    r = cfg.reward
    if r.enable and r.backend == "hf" and (r.parallel.tp, r.parallel.pp, r.parallel.cp) != (1, 1, 1):
        problems.append(
            f"reward.backend=hf runs the classifier data-parallel only, but reward.parallel has tp={r.parallel.tp}, "
            f"pp={r.parallel.pp}, cp={r.parallel.cp}; set them to 1 or use reward.backend=megatron"
        )
    if r.enable and r.backend == "megatron" and r.kind != "classifier":
        problems.append(
            f"reward.kind={r.kind} needs reward.backend=hf (a sentence-embedding model runs in transformers)"
        )
    if cfg.reward.enable and not cfg.reward.model_path:
        problems.append(
            "reward.enable=true but reward.model_path is not set; set reward.model_path=/path/to/reward_model "
            "or reward.enable=false to use rule rewards"
        )
    for name in ("gamma", "lam"):
        value = getattr(a, name)
        in_range(problems, f"algorithm.{name}", value, "[0, 1]", 0 <= value <= 1, "e.g. 1.0")
    at_least(problems, "algorithm.kl_coef", a.kl_coef, 0, "e.g. 0.001, or 0 for no KL")
    at_least(problems, "algorithm.kl_loss_coef", a.kl_loss_coef, 0, "e.g. 0.001, or 0 for no KL loss")
    own = LOSS_PARAMS[a.policy_loss]
    for key in sorted(set(a.policy_loss_params) - set(own)):
        takes = f"it takes {', '.join(own)}" if own else "it takes no parameters"
        problems.append(
            f"algorithm.policy_loss_params.{key} is not a parameter of algorithm.policy_loss={a.policy_loss} "
            f"({takes}); remove it or pick the loss it belongs to"
        )
    _check_rollout_correction(a.rollout_correction, problems)
    if a.rollout_correction.bypass_mode and ESTIMATOR_TRAITS[a.adv_estimator].needs_sum_pi_squared:
        problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} needs the actor's Σπ² per token, which its log-prob "
            "pass computes, but algorithm.rollout_correction.bypass_mode=true skips that pass; set "
            "bypass_mode=false or pick another estimator"
        )
    if a.pf_ppo.enable:
        at_least(problems, "algorithm.pf_ppo.weight_pow", a.pf_ppo.weight_pow, 0, "e.g. 2.0")
    ok = 0 < a.clip_ratio_low < 1
    in_range(problems, "algorithm.clip_ratio_low", a.clip_ratio_low, "(0, 1)", ok, "e.g. 0.2")
    if a.clip_ratio_high <= 0:
        problems.append(f"algorithm.clip_ratio_high={a.clip_ratio_high} must be > 0; e.g. 0.2 (or 0.28)")
    if a.clip_ratio_c is not None and a.clip_ratio_c <= 1:
        problems.append(
            f"algorithm.clip_ratio_c={a.clip_ratio_c} must be > 1 (dual clip caps the loss of negative-advantage "
            "tokens at clip_ratio_c·|A|); e.g. 3.0, or null to disable dual clip"
        )
    if a.kl_ctrl == "adaptive":
        if not a.use_kl_in_reward:
            problems.append(
                "algorithm.kl_ctrl=adaptive steers the in-reward KL coefficient but algorithm.use_kl_in_reward="
                "false; set algorithm.use_kl_in_reward=true or algorithm.kl_ctrl=fixed"
            )
        if a.kl_target <= 0:
            problems.append(f"algorithm.kl_target={a.kl_target} must be > 0; e.g. 0.1")
        at_least(problems, "algorithm.kl_horizon", a.kl_horizon, 1, "e.g. 10000")
    if a.value_clip <= 0:
        problems.append(f"algorithm.value_clip={a.value_clip} must be > 0; e.g. 0.5")
    at_least(problems, "algorithm.entropy_coeff", a.entropy_coeff, 0, "e.g. 0")
    at_least(problems, "algorithm.ppo_epochs", a.ppo_epochs, 1, "e.g. 1")
    at_least(problems, "algorithm.ppo_mini_batch_size", a.ppo_mini_batch_size, 1, "e.g. 16 prompts")


def _check_rollout_correction(rc: Any, problems: list[str]) -> None:
    key = "algorithm.rollout_correction"
    if rc.rollout_is is not None and rc.rollout_is_threshold <= 1:
        problems.append(
            f"{key}.rollout_is_threshold={rc.rollout_is_threshold} must be > 1 (IS weights are truncated "
            "at it); e.g. 2.0"
        )
    if rc.rollout_rs is not None:
        upper, lower = rc.rollout_rs_threshold, rc.rollout_rs_threshold_lower
        if upper is None or upper <= 1:
            problems.append(
                f"{key}.rollout_rs={rc.rollout_rs} keeps ratios up to {key}.rollout_rs_threshold, which is "
                f"{upper}; set it > 1, e.g. {key}.rollout_rs_threshold=2.0"
            )
        elif lower is not None and not 0 < lower < upper:
            problems.append(
                f"{key}.rollout_rs_threshold_lower={lower} must be in (0, rollout_rs_threshold={upper}); "
                "e.g. 0.5, or null for 1 / rollout_rs_threshold"
            )
    veto = rc.rollout_token_veto_threshold
    if veto is not None and not 0 < veto < 1:
        problems.append(f"{key}.rollout_token_veto_threshold={veto} must be in (0, 1); e.g. 1e-4, or null")
    if rc.bypass_mode and (rc.rollout_is is not None or rc.rollout_rs is not None):
        problems.append(
            f"{key}.bypass_mode=true uses the engine's log-probs as the old ones, so the IS ratio would be 1; "
            f"unset {key}.rollout_is and {key}.rollout_rs, or set bypass_mode=false"
        )


def _check_batches(cfg: MegarlConfig, layouts: dict[str, ParallelLayout], problems: list[str]) -> None:
    """Prompts → mini-batches → data-parallel ranks → micro-batches must all split evenly."""
    train, mini, n = cfg.data.train_batch_size, cfg.algorithm.ppo_mini_batch_size, cfg.rollout.n
    if cfg.algorithm.name == "sft":  # one optimizer step per batch of (prompt, response) pairs
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
        if role == "reward" and cfg.reward.backend == "hf":
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
    _check_profiling(cfg, problems)


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
