"""load_config / validate: every bad config is rejected with a message naming the key and the fix."""

from pathlib import Path

import pytest

from megarl.config import ConfigError, MegarlConfig, config_to_yaml, load_config, validate
from tests.helpers.hf_configs import TINY_LLAMA, write_model_config

pytestmark = pytest.mark.unit

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
QUICKSTART = CONFIGS / "quickstart_grpo.yaml"
# The sizes the expected messages below are written for (the shipped file's own may be retuned).
SIZES = [
    "data.train_batch_size=8",
    "rollout.n=4",
    "algorithm.ppo_mini_batch_size=4",
    "actor.micro_batch_size=4",
    "ref.micro_batch_size=4",
    "actor.optimizer.lr=1e-5",
    "trainer.total_steps=10",
    "trainer.eval_every=5",
    "data.max_prompt_length=64",
    "data.max_response_length=32",
]


@pytest.fixture
def tiny_run(tmp_path: Path) -> list[str]:
    """Overrides that point the quickstart config at a tiny Llama config.json and existing data files."""
    model = write_model_config(tmp_path / "tiny_llama", TINY_LLAMA)
    for name in ("train", "val"):
        (tmp_path / f"{name}.parquet").touch()
    return [
        f"model.path={model}",
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        f"data.val_files=[{tmp_path / 'val.parquet'}]",
        f"trainer.output_dir={tmp_path / 'run'}",
        *SIZES,
    ]


def _error(overrides: list[str], path: Path | None = QUICKSTART, check_paths: bool = True) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, check_paths=check_paths)
    return info.value


INVALID = [
    (
        ["actor.parallel.tp=3"],
        ["actor.parallel.tp=3 does not divide num_attention_heads=8", "use one of 1, 2, 4"],
    ),
    (["actor.parallel.tp=two"], ["actor.parallel.tp=two", "expected an integer", "e.g. actor.parallel.tp=1"]),
    (["actor.paralel.tp=2"], ["unknown key 'actor.paralel' — did you mean 'actor.parallel'?"]),
    (
        ["actor.parallel.pp=3"],
        ["actor.parallel.pp=3 does not divide num_hidden_layers=4", "use one of 1, 2, 4"],
    ),
    (
        ["actor.parallel.tp=4"],
        ["actor.parallel: tp·pp·cp = 4·1·1 = 4 does not divide the 2 devices of the actor"],
    ),
    (["actor.parallel.sequence_parallel=true"], ["sequence_parallel=true needs actor.parallel.tp > 1"]),
    (
        ["actor.parallel.vpp=2"],
        ["actor.parallel.vpp=2 needs actor.parallel.pp > 1", "set actor.parallel.vpp=null"],
    ),
    (
        ["actor.parallel.pp=2", "actor.parallel.vpp=4"],
        ["pp·vpp = 8 does not divide num_hidden_layers=4", "vpp in 1, 2"],
    ),
    (["actor.parallel.ep=2"], ["actor.parallel.ep=2 but the model is dense", "set actor.parallel.ep=1"]),
    (["actor.n_devices=4"], ["actor.n_devices=4 exceeds the 2 devices of the cluster", "lower it"]),
    (["trainer.launcher=torchrun", "actor.n_devices=1"], ["actor.n_devices=1 needs trainer.launcher=ray"]),
    (["rollout.tp=2"], ["rollout.tp=2 does not divide actor.parallel.tp=1", "use one of 1"]),
    (["model.dtype=bf17"], ["model.dtype=bf17", "one of fp32, bf16, fp16"]),
    (
        ["model.make_vocab_size_divisible_by=0"],
        ["model.make_vocab_size_divisible_by=0 must be ≥ 1", "use 128"],
    ),
    (["model.path={tmp}/missing"], ["/missing does not exist", "Hugging Face checkpoint directory"]),
    (["rollout.top_p=0"], ["rollout.top_p=0.0 must be in (0, 1]"]),
    (["rollout.temperature=-1"], ["rollout.temperature=-1.0 must be ≥ 0"]),
    (["rollout.temperature=0"], ["rollout.temperature=0 (greedy)", "set rollout.temperature > 0"]),
    (["rollout.n=1"], ["rollout.n=1 but algorithm.adv_estimator=grpo", "set rollout.n ≥ 2"]),
    (["actor.optimizer.lr=0"], ["actor.optimizer.lr=0.0 must be > 0", "e.g. actor.optimizer.lr=1e-6"]),
    (["actor.optimizer.min_lr=1"], ["actor.optimizer.min_lr=1.0 must be in [0, actor.optimizer.lr=1e-05]"]),
    (["actor.optimizer.lr_warmup_steps=10"], ["lr_warmup_steps=10 is not below trainer.total_steps=10"]),
    (["actor.optimizer.name=rmsprop"], ["actor.optimizer.name=rmsprop", "one of adamw, adam, sgd"]),
    (
        ["actor.optimizer.name=sgd"],
        ["actor.optimizer.name=sgd needs actor.optimizer.use_distributed_optimizer=false"],
    ),
    (
        [
            "actor.optimizer.name=sgd",
            "actor.optimizer.use_distributed_optimizer=false",
            "actor.optimizer.momentum=1",
        ],
        ["actor.optimizer.momentum=1.0 must be in [0, 1)"],
    ),
    (
        ["actor.optimizer.momentum=0.9"],
        ["actor.optimizer.momentum=0.9 is SGD's", "set actor.optimizer.name=sgd"],
    ),
    (
        ["data.train_batch_size=7"],
        ["data.train_batch_size=7 is not a multiple of the actor's data-parallel size 2"],
    ),
    (["algorithm.ppo_mini_batch_size=16"], ["ppo_mini_batch_size=16 exceeds data.train_batch_size=8"]),
    (["algorithm.ppo_mini_batch_size=3"], ["ppo_mini_batch_size=3 does not divide data.train_batch_size=8"]),
    (
        ["actor.micro_batch_size=3"],
        ["actor.micro_batch_size=3 does not divide the 8 sequences", "use one of 1, 2, 4, 8"],
    ),
    (["actor.max_tokens_per_micro_batch=50"], ["max_tokens_per_micro_batch=50 is smaller than one sequence"]),
    (["data.max_response_length=0"], ["data.max_response_length=0 must be ≥ 1"]),
    (["data.train_files=[prompts.csv]"], ["data.train_files[0]=prompts.csv has an unsupported format"]),
    (["algorithm.clip_ratio_low=0"], ["algorithm.clip_ratio_low=0.0 must be in (0, 1)"]),
    (["algorithm.gamma=1.5"], ["algorithm.gamma=1.5 must be in [0, 1]"]),
    # the estimator alone picks the algorithm (verl's rule, megarl.config.verl_keys); both given contradict
    (
        ["algorithm.name=grpo", "algorithm.adv_estimator=gae"],
        ["algorithm.adv_estimator=gae contradicts algorithm.name=grpo"],
    ),
    (
        ["algorithm.name=ppo", "algorithm.adv_estimator=gae", "critic.enable=false"],
        ["adv_estimator=gae needs a value model but critic.enable=false", "set critic.enable=true"],
    ),
    (["ref.enable=false"], ["algorithm.use_kl_loss=true needs the reference model", "set ref.enable=true"]),
    (["reward.enable=true"], ["reward.model_path is not set", "set reward.model_path="]),
    (["rollout.reshard_bucket_mib=0"], ["rollout.reshard_bucket_mib=0", "e.g. 256"]),
    (["rollout.val.max_tokens=0"], ["rollout.val.max_tokens=0", "data.max_response_length"]),
    (
        ["reward.model_path={tmp}", "reward.backend=hf", "reward.parallel.tp=2"],
        ["reward.backend=hf runs the classifier data-parallel only", "use reward.backend=megatron"],
    ),
    (
        ["reward.model_path={tmp}", "reward.kind=embedding_similarity"],
        ["reward.kind=embedding_similarity needs reward.backend=hf"],
    ),
    (["algorithm.kl_penalty=k4"], ["algorithm.kl_penalty=k4", "one of k1, k2, k3, low_var_kl"]),
    (
        ["algorithm.kl_estimator=k3"],
        ["'algorithm.kl_estimator' — it was split/renamed: use algorithm.kl_penalty"],
    ),
    (
        ["algorithm.adv_estimator=a2c"],
        [
            "algorithm.adv_estimator=a2c",
            "gae, grpo, drgrpo, rloo, reinforce_plus_plus, reinforce_plus_plus_baseline",
        ],
    ),
    (
        ["algorithm.name=grpo", "algorithm.adv_estimator=rloo"],
        ["adv_estimator=rloo contradicts algorithm.name=grpo (which uses grpo or"],
    ),
    (["algorithm.adv_estimator=drgrpo", "rollout.n=1"], ["rollout.n=1 but algorithm.adv_estimator=drgrpo"]),
    (
        ["algorithm.name=ppo", "algorithm.adv_estimator=rloo", "rollout.n=1"],
        ["rollout.n=1 but algorithm.adv_estimator=rloo", "set rollout.n ≥ 2"],
    ),
    (
        ["algorithm.name=ppo", "algorithm.adv_estimator=reinforce_plus_plus_baseline", "rollout.n=1"],
        ["rollout.n=1 but algorithm.adv_estimator=reinforce_plus_plus_baseline"],
    ),
    (["algorithm.clip_ratio_c=1.0"], ["algorithm.clip_ratio_c=1.0 must be > 1", "e.g. 3.0, or null"]),
    (["algorithm.policy_loss=dppo_tv"], ["algorithm.policy_loss=dppo_tv", "one of vanilla, gspo, cispo"]),
    (["algorithm.loss_agg_mode=seq-mean"], ["algorithm.loss_agg_mode=seq-mean", "seq-mean-token-sum-norm"]),
    (["algorithm.kl_ctrl=pid"], ["algorithm.kl_ctrl=pid", "one of fixed, adaptive"]),
    (["algorithm.kl_loss_coef=-1"], ["algorithm.kl_loss_coef=-1.0 must be ≥ 0"]),
    (
        ["algorithm.policy_loss=sapo", "algorithm.policy_loss_params={tau_pos: 1.0, clip_cov_ratio: 0.1}"],
        ["algorithm.policy_loss_params.clip_cov_ratio is not a parameter of algorithm.policy_loss=sapo"],
    ),
    (
        ["algorithm.policy_loss_params={tau_pos: 1.0}"],
        ["policy_loss_params.tau_pos is not a parameter of algorithm.policy_loss=vanilla (it takes no param"],
    ),
    (
        ["algorithm.rollout_correction.rollout_rs=geometric"],
        ["rollout_rs=geometric keeps ratios up to", "rollout_correction.rollout_rs_threshold=2.0"],
    ),
    (
        [
            "algorithm.rollout_correction.rollout_rs=token",
            "algorithm.rollout_correction.rollout_rs_threshold=2",
            "algorithm.rollout_correction.rollout_rs_threshold_lower=3",
        ],
        ["rollout_rs_threshold_lower=3.0 must be in (0, rollout_rs_threshold=2.0)"],
    ),
    (
        [
            "algorithm.rollout_correction.rollout_is=token",
            "algorithm.rollout_correction.rollout_is_threshold=1",
        ],
        ["rollout_is_threshold=1.0 must be > 1"],
    ),
    (["algorithm.rollout_correction.rollout_is=tok"], ["rollout_is=tok", "one of token, sequence"]),
    (
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_is=token"],
        [
            "bypass_mode=true uses the engine's log-probs as the old ones",
            "which is then exactly 1 (verl computes them from π_θ/π_rollout inside the loss",
            "Unset algorithm.rollout_correction.rollout_is",
        ],
    ),
    (
        ["algorithm.rollout_correction.rollout_rs=seq_mean_k3"],
        [
            "rollout_rs=seq_mean_k3 drops what exceeds",
            "set it > 0, e.g. algorithm.rollout_correction.rollout_rs",
        ],
    ),
    (
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.adv_estimator=optimal_token_baseline"],
        ["optimal_token_baseline needs the actor's Σπ²", "bypass_mode=false"],
    ),
    (
        ["algorithm.pf_ppo.enable=true", "algorithm.pf_ppo.weight_pow=-1"],
        ["pf_ppo.weight_pow=-1.0 must be ≥ 0"],
    ),
    (["algorithm.pf_ppo.reweight_method=top"], ["reweight_method=top", "one of pow, max_min, max_random"]),
    (
        ["algorithm.kl_ctrl=adaptive"],
        ["kl_ctrl=adaptive steers the in-reward KL coefficient", "set algorithm.use_kl_in_reward=true"],
    ),
    (
        ["algorithm.kl_ctrl=adaptive", "algorithm.use_kl_in_reward=true", "algorithm.kl_target=0"],
        ["algorithm.kl_target=0.0 must be > 0"],
    ),
    (
        ["algorithm.kl_ctrl=adaptive", "algorithm.use_kl_in_reward=true", "algorithm.kl_horizon=0"],
        ["algorithm.kl_horizon=0 must be ≥ 1"],
    ),
    (
        ["logging.backends=[console,mlflow]"],
        ["logging.backends=[console, mlflow]", "console, jsonl, tensorboard, wandb"],
    ),
    (["logging.backends=[console,console]"], ["logging.backends lists console more than once"]),
    (
        ["trainer.profile_steps=[0,3,12]"],
        ["trainer.profile_steps=[0, 3, 12] has 0, 12 outside 1..10 (trainer.total_steps)"],
    ),
    (
        ["trainer.profile_ranks=[-1,1,2]"],
        ["trainer.profile_ranks=[-1, 1, 2] has -1, 2 outside 0..1 (the profiled worker groups have 2 ranks)"],
    ),
    (["trainer.launcher=slurm"], ["trainer.launcher=slurm", "one of ray, torchrun"]),
    (["trainer.worker_timeout_s=0"], ["trainer.worker_timeout_s=0.0 must be > 0", "e.g. 1800"]),
    (["trainer.max_bad_steps=0"], ["trainer.max_bad_steps=0 must be ≥ 1"]),
    (["trainer.preempt_grace_s=-1"], ["trainer.preempt_grace_s=-1.0 must be a number of seconds ≥ 0"]),
    (
        ["trainer.preempt_grace_s=nan"],
        ["trainer.preempt_grace_s=nan is not a finite number", "e.g. trainer.preempt_grace_s=60"],
    ),
    (["trainer.resume=/nonexistent/ckpt"], ["trainer.resume=/nonexistent/ckpt is neither auto, disable nor"]),
    (["trainer.eval_every=5", "data.val_files=[]"], ["trainer.eval_every=5 but data.val_files is empty"]),
    (["algorithm.name=dpo", "preference.beta=0"], ["preference.beta=0.0 must be > 0"]),
    (
        ["algorithm.name=ipo", "preference.label_smoothing=0.1"],
        ["preference.label_smoothing=0.1 applies to dpo and simpo only, not ipo"],
    ),
    (
        ["algorithm.name=dpo", "preference.label_smoothing=0.5"],
        ["preference.label_smoothing=0.5 must be in [0, 0.5)"],
    ),
    (
        ["algorithm.name=kto", "preference.undesirable_weight=-1"],
        ["preference.undesirable_weight=-1.0 must be ≥ 0"],
    ),
    (
        ["algorithm.name=kto", "ref.enable=false"],
        ["algorithm.name=kto compares the policy with the reference"],
    ),
    (["algorithm.name=orpo", "ref.enable=true"], ["algorithm.name=orpo uses no reference model"]),
    (
        ["algorithm.name=simpo", "preference.precompute_ref=true"],
        ["algorithm.name=simpo has no reference model"],
    ),
    (
        ["algorithm.old_log_prob=fused", "algorithm.ppo_epochs=2", "algorithm.use_kl_in_reward=true"],
        [
            "algorithm.ppo_epochs=2 (needs 1)",
            "algorithm.use_kl_in_reward=true (the reward's KL",
            "set algorithm.old_log_prob=recompute",
        ],
    ),
    (
        ["rollout.calculate_log_probs=false", "algorithm.rollout_correction.rollout_is=token"],
        [
            "rollout.calculate_log_probs=false, but algorithm.rollout_correction.rollout_is reads",
            "set rollout.calculate_log_probs=true",
        ],
    ),
    (["actor.parallel.tp"], ["override 'actor.parallel.tp' is not key=value"]),
    (["actor=3"], ["actor is a section, not a value"]),
]


@pytest.mark.parametrize(("overrides", "expected"), INVALID, ids=lambda v: " ".join(v) if v else "")
def test_invalid_config_names_key_and_fix(tmp_path, tiny_run, overrides, expected):
    overrides = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    message = str(_error(tiny_run + overrides))
    for fragment in expected:
        assert fragment in message


def test_unknown_key_in_yaml_suggests_the_right_one(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("actor:\n  paralel:\n    tp: 2\nrollout:\n  temprature: 0.7\n")
    err = _error([], path, check_paths=False)
    assert "unknown key 'actor.paralel' — did you mean 'actor.parallel'?" in err.problems
    assert "unknown key 'rollout.temprature' — did you mean 'rollout.temperature'?" in err.problems


def test_misplaced_leaf_suggests_its_full_keys():
    err = _error(["tp=2"], None, check_paths=False)
    assert "'actor.parallel.tp'" in str(err) and "'rollout.tp'" in str(err)


def test_one_error_lists_every_problem(tiny_run):
    overrides = ["actor.parallel.tp=3", "rollout.top_p=2", "algorithm.gamma=-1", "logging.log_every=0"]
    err = _error(tiny_run + overrides)
    assert len(err.problems) >= 4
    assert str(err).startswith(f"invalid megarl config ({len(err.problems)} problems):")
    for key in ("actor.parallel.tp=3", "rollout.top_p=2.0", "algorithm.gamma=-1.0", "logging.log_every=0"):
        assert any(p.startswith(key) for p in err.problems), key


def test_type_errors_are_all_reported_before_semantic_checks():
    err = _error(["actor.parallel.tp=two", "rollout.n=many", "model.dtype=int4"], None, check_paths=False)
    assert len(err.problems) == 3


def test_omegaconf_errors_do_not_escape(tmp_path):
    err = _error(["actor.parallel.tp=${nowhere.tp}"], None, check_paths=False)
    assert "actor.parallel.tp" in str(err) and err.__suppress_context__
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("actor: [1,\n  tp: 2\n")
    assert "is not valid YAML" in str(_error([], bad_yaml))
    assert "does not exist" in str(_error([], tmp_path / "absent.yaml"))


def test_overrides_apply_in_order_on_top_of_the_file():
    cfg = load_config(
        QUICKSTART,
        [
            "rollout.n=2",
            "rollout.n=8",
            "actor.optimizer.lr=3e-6",
            "data.train_files=x.parquet",
            "rollout.top_k=50",
        ],
        check_paths=False,
    )
    assert cfg.rollout.n == 8
    assert cfg.actor.optimizer.lr == pytest.approx(3e-6)
    assert cfg.data.train_files == ["x.parquet"]
    assert cfg.rollout.top_k == 50
    assert cfg.data.max_prompt_length == 32  # from the file
    assert cfg.actor.optimizer.betas == [0.9, 0.999]  # schema default


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load_without_model(path, tmp_path):
    cfg = load_config(path, check_paths=False)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(config_to_yaml(cfg))
    assert load_config(dumped, check_paths=False) == cfg


def test_tiny_model_quickstart_passes_and_resolves_auto_fields(tiny_run):
    cfg = load_config(QUICKSTART, tiny_run)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.critic.enable is False and cfg.ref.enable is True and cfg.reward.enable is False
    assert cfg.world_size("actor") == 2 and cfg.layout("actor").dp == 2
    assert cfg.parallel_of("ref") is cfg.actor.parallel


def test_ppo_llama_8b_layout_fits_llama3_8b(tmp_path):
    llama3 = dict(
        TINY_LLAMA,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=32,
        vocab_size=128256,
        max_position_embeddings=8192,
    )
    model = write_model_config(tmp_path / "llama3_8b", llama3)
    (tmp_path / "train.parquet").touch()
    overrides = [
        f"model.path={model}",
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        "data.val_files=[]",
    ]
    cfg = load_config(CONFIGS / "ppo_llama_8b.yaml", [*overrides, "trainer.eval_every=0"])
    assert cfg.critic.enable and cfg.ref.enable
    assert cfg.layout("actor").dp == cfg.layout("critic").dp == 2
    err = _error(
        [*overrides, "trainer.eval_every=0", "rollout.tp=8", "actor.parallel.pp=3"],
        CONFIGS / "ppo_llama_8b.yaml",
    )
    assert any(p.startswith("rollout.tp=8 does not divide actor.parallel.tp=4") for p in err.problems)
    assert any(p.startswith("actor.parallel.pp=3 does not divide num_hidden_layers=32") for p in err.problems)


def test_profiling_any_step_of_the_run_on_any_rank_loads(tiny_run):
    cfg = load_config(QUICKSTART, [*tiny_run, "trainer.profile_steps=[1,10]", "trainer.profile_ranks=[0,1]"])
    assert (cfg.trainer.profile_steps, cfg.trainer.profile_ranks) == ([1, 10], [0, 1])
    assert (MegarlConfig().trainer.profile_steps, MegarlConfig().trainer.profile_ranks) == ([], [0])


def test_config_to_yaml_round_trips(tmp_path, tiny_run):
    cfg = load_config(QUICKSTART, tiny_run)
    path = tmp_path / "dumped.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(path) == cfg


def test_validate_checks_configs_built_in_python():
    cfg = MegarlConfig()
    cfg.model.dtype = "bf17"  # type: ignore[assignment]
    cfg.logging.backends = ["console", "mlflow"]  # type: ignore[list-item]
    with pytest.raises(ConfigError) as info:
        validate(cfg, check_paths=False)
    assert "model.dtype='bf17', which is not allowed; use one of fp32, bf16, fp16" in info.value.problems
    assert any(p.startswith("logging.backends contains 'mlflow'") for p in info.value.problems)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.adv_estimator=drgrpo", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
        [
            "algorithm.policy_loss=gspo",
            "algorithm.loss_agg_mode=seq-mean-token-mean",
            "algorithm.clip_ratio_c=3",
        ],
        ["algorithm.name=ppo", "algorithm.adv_estimator=rloo"],
        ["algorithm.name=ppo", "algorithm.adv_estimator=reinforce_plus_plus_baseline"],
        ["algorithm.name=ppo", "algorithm.adv_estimator=grpo_passk"],
        ["algorithm.name=ppo", "algorithm.adv_estimator=opo"],
        ["algorithm.name=ppo", "algorithm.adv_estimator=gpg"],
        ["algorithm.name=ppo", "algorithm.adv_estimator=optimal_token_baseline"],
        ["algorithm.norm_adv_by_std_in_grpo=false", "algorithm.loss_agg_mode=seq-mean-token-sum-norm"],
        ["algorithm.policy_loss=clip_cov", "algorithm.policy_loss_params={clip_cov_ratio: 0.001}"],
        ["algorithm.policy_loss=sapo"],
        ["algorithm.use_kl_loss=true", "algorithm.kl_loss_type=k3+", "algorithm.kl_loss_coef=0.01"],
        [
            "algorithm.rollout_correction.rollout_is=sequence",
            "algorithm.rollout_correction.rollout_rs=geometric",
            "algorithm.rollout_correction.rollout_rs_threshold=1.5",
        ],
        ["algorithm.rollout_correction.bypass_mode=true", "algorithm.policy_loss=reinforce"],
        ["algorithm.pf_ppo.enable=true", "algorithm.pf_ppo.reweight_method=max_min"],
        ["algorithm.name=ppo", "algorithm.adv_estimator=remax", "algorithm.use_kl_in_reward=true"],
        [
            "algorithm.name=ppo",
            "algorithm.adv_estimator=gae",
            "algorithm.kl_ctrl=adaptive",
            "algorithm.use_kl_in_reward=true",
        ],
    ],
    ids=lambda v: " ".join(v),
)
def test_algorithm_variants_load(tiny_run, overrides):
    cfg = load_config(QUICKSTART, tiny_run + overrides)
    assert cfg.critic.enable == (cfg.algorithm.adv_estimator == "gae")


def test_auto_is_decided_once_and_again_only_for_a_field_set_back_to_none():
    from megarl.config import resolve_auto

    cfg = load_config(
        None, ["algorithm.name=grpo", "rollout.n=4", "data.train_batch_size=16"], check_paths=False
    )
    assert resolve_auto(cfg) is cfg  # loaded = resolved: nothing left to decide, nothing copied
    cfg.algorithm.old_log_prob = None  # "None: auto decides again"
    again = resolve_auto(cfg)
    assert again is not cfg and again.algorithm.old_log_prob == "fused" and cfg.algorithm.old_log_prob is None
