"""verl's override vocabulary: every key of verl's trainer configs is mapped to megarl's or explained, each
override form verl users write is read, ignored keys warn once, conflicts and impossible values stop the
load naming the keys, and verl's example scripts pass `megarl config show` as shipped."""

import re
from pathlib import Path

import pytest
import yaml

from megarl.cli import main
from megarl.config import ConfigError, load_config, settings_as_megarl
from megarl.config.verl_keys import VERL_KEYS, lookup
from megarl.config.verl_translate import is_megarl_key
from tests.helpers.data import verl_row, write_parquet
from tests.helpers.hf_configs import TINY_LLAMA, write_model_config
from tests.helpers.verl_scripts import SCRIPTS, with_paths

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
QUICKSTART = REPO / "configs" / "quickstart_grpo.yaml"
VERL_TRAINER_KEYS = Path(__file__).with_name("verl_trainer_keys.txt")


def load(*overrides, path=None):
    return load_config(path, list(overrides), check_paths=False)


def warnings_of(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("megarl: ")]


def test_every_key_of_verls_trainer_configs_is_mapped_or_explained():
    keys = [k for k in VERL_TRAINER_KEYS.read_text().splitlines() if k and not k.startswith("#")]
    assert len(keys) > 600
    unexplained = [k for k in keys if not is_megarl_key(k) and lookup(k) is None]
    assert unexplained == []
    for key in keys:  # a verl key spelled as megarl's is megarl's with verl's meaning: the table says so
        if is_megarl_key(key) and not key.startswith("algorithm.rollout_correction."):
            assert lookup(key) is not None and lookup(key).megarl == key, key


def test_every_mapped_megarl_key_exists_and_every_ignored_key_says_why():
    for entry in VERL_KEYS:
        if entry.megarl is not None:
            assert is_megarl_key(entry.megarl), entry
        else:
            assert len(entry.note) > 10, entry


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.rollout.n=5",
        "+actor_rollout_ref.rollout.n=5",
        "++actor_rollout_ref.rollout.n=5",
        "+rollout.n=5",
    ],
)
def test_hydra_add_forms_read_as_plain_overrides(override):
    assert load(override).rollout.n == 5


@pytest.mark.parametrize(
    "override",
    [
        "trainer.logger=[console,wandb]",
        'trainer.logger=["console","wandb"]',
        "trainer.logger='[console,wandb]'",  # the shell's quotes kept, as a launcher may pass them
        "++trainer.logger=['console', 'wandb']",
    ],
)
def test_list_forms_read_as_lists(override):
    assert load(override).logging.backends == ["console", "wandb"]


def test_a_lone_value_for_a_list_key_is_a_one_element_list():
    cfg = load("data.train_files=/d/train.parquet", "trainer.logger=console")
    assert cfg.data.train_files == ["/d/train.parquet"] and cfg.logging.backends == ["console"]


def test_verl_keys_land_on_megarl_keys_in_the_same_units():
    cfg = load(
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=64",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",  # prompts, ×n in both
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",  # sequences per DP rank in both
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.optim.lr=3e-6",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=-1",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
        "actor_rollout_ref.actor.policy_loss.clip_cov_ratio=0.001",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.param_offload=True",
        "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.rollout.top_p=0.9",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=12",
        "custom_reward_function.path=/r/score.py",
        "custom_reward_function.name=my_score",
        "algorithm.kl_ctrl.kl_coef=0.01",
        "algorithm.kl_ctrl.type=adaptive",
        "algorithm.use_kl_in_reward=True",
        "trainer.n_gpus_per_node=4",
        "trainer.total_training_steps=7",
        "trainer.save_freq=5",
        "trainer.test_freq=-1",
        "trainer.project_name=p",
        "trainer.experiment_name=e",
        "trainer.default_local_dir=/out/run",
        "trainer.logger=[console,file]",
    )
    a = cfg.algorithm
    assert (a.name, a.adv_estimator, a.ppo_mini_batch_size, a.ppo_epochs) == ("grpo", "grpo", 16, 2)
    assert (cfg.data.train_batch_size, cfg.rollout.n, cfg.actor.micro_batch_size) == (64, 4, 8)
    o = cfg.actor.optimizer
    assert (o.lr, o.lr_decay_style, o.lr_warmup_steps) == (3e-6, "cosine", 0)
    assert (a.clip_ratio_low, a.clip_ratio_high, a.loss_agg_mode) == (0.2, 0.28, "seq-mean-token-mean")
    assert a.policy_loss == "clip_cov" and a.policy_loss_params == {"clip_cov_ratio": 0.001}
    assert cfg.actor.parallel.pp == 2 and cfg.actor.offload_params
    assert (cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.val.temperature) == (0.7, 0.9, 0.0)
    assert cfg.ref.micro_batch_size == 12
    assert (cfg.reward.function.path, cfg.reward.function.name) == ("/r/score.py", "my_score")
    assert (a.kl_coef, a.kl_ctrl, a.use_kl_in_reward) == (0.01, "adaptive", True)
    t = cfg.trainer
    assert (t.n_devices_per_node, t.total_steps, t.save_every, t.eval_every) == (4, 7, 5, 0)
    assert (cfg.logging.project, cfg.logging.run_name, t.output_dir) == ("p", "e", "/out/run")
    assert cfg.logging.backends == ["console", "jsonl"]


@pytest.mark.parametrize(("freq", "save_every"), [(20, 20), (0, -1), (-1, -1)])
def test_save_freq_never_below_one_in_verl_is_never_in_megarl(freq, save_every):
    assert load(f"trainer.save_freq={freq}").trainer.save_every == save_every


def test_clip_ratio_sets_both_bounds_except_the_one_given():
    a = load("actor_rollout_ref.actor.clip_ratio=0.3").algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.3, 0.3)
    a = load(
        "actor_rollout_ref.actor.clip_ratio=0.3", "actor_rollout_ref.actor.clip_ratio_high=0.28"
    ).algorithm
    assert (a.clip_ratio_low, a.clip_ratio_high) == (0.3, 0.28)


def test_token_budgets_apply_only_with_dynamic_batching(capsys):
    cfg = load(
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
    )
    assert cfg.actor.max_tokens_per_micro_batch == 4096
    assert load("actor_rollout_ref.actor.use_dynamic_bsz=True").actor.max_tokens_per_micro_batch == 16384
    capsys.readouterr()
    assert (
        load("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096").actor.max_tokens_per_micro_batch
        is None
    )
    assert warnings_of(capsys) == [
        "megarl: ignoring verl's actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096: it applies only with "
        "actor_rollout_ref.actor.use_dynamic_bsz=true"
    ]


def test_keys_without_megarl_meaning_warn_once_each_with_the_reason(capsys):
    capsys.readouterr()
    load(
        "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.rollout.mode=async",
        "trainer.use_legacy_worker_impl=auto",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40",
        "actor_rollout_ref.rollout.mode=sync",  # the same key again: the later value, one line
    )
    assert warnings_of(capsys) == [
        "megarl: ignoring verl's actor_rollout_ref.model.use_remove_padding=true: megarl packs sequences without "
        "padding when actor.max_tokens_per_micro_batch is set (verl's use_dynamic_bsz + ppo_max_token_len_per_gpu); "
        "otherwise micro-batches are right-padded",
        "megarl: ignoring verl's trainer.use_legacy_worker_impl=auto: megarl has one worker implementation",
        "megarl: ignoring verl's actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40: megarl computes "
        "the old log-probs in the actor's micro-batches (actor.micro_batch_size) or fuses them into the update "
        "(algorithm.old_log_prob)",
        "megarl: ignoring verl's actor_rollout_ref.rollout.mode=sync: megarl's engines run in-process: inside "
        "the actor's processes, or in a pool of their own (rollout.placement=separate)",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor_rollout_ref.rollout.n=5", "rollout.n=4"],
            "actor_rollout_ref.rollout.n=5 and rollout.n=4 both set rollout.n, differently; keep one of them",
        ),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=16", "critic.ppo_mini_batch_size=8"],
            "actor_rollout_ref.actor.ppo_mini_batch_size=16 and critic.ppo_mini_batch_size=8 both set "
            "algorithm.ppo_mini_batch_size, differently; keep one of them",
        ),
        (
            [
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1",
            ],
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 and "
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=1 both set actor.parallel.tp, differently",
        ),
        (
            ["actor_rollout_ref.actor.optim.lr=1e-6", "actor.optimizer.lr=2e-6"],
            "both set actor.optimizer.lr, differently",
        ),
    ],
)
def test_a_verl_key_and_its_megarl_twin_set_differently_is_an_error_naming_both(overrides, message):
    with pytest.raises(ConfigError) as e:
        load(*overrides)
    assert message in str(e.value)


def test_a_verl_key_and_its_megarl_twin_set_alike_is_fine(capsys):
    cfg = load(
        "actor_rollout_ref.rollout.n=5",
        "rollout.n=5",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
    )
    assert cfg.rollout.n == 5 and cfg.actor.parallel.tp == 2 and cfg.ref.parallel is None
    capsys.readouterr()
    load("actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2")  # no actor TP given: ignored
    assert warnings_of(capsys) == [
        "megarl: ignoring verl's actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2: megarl's colocated "
        "reference runs with the actor's layout; set actor.parallel.tp"
    ]


def test_a_later_setting_of_the_same_key_wins_as_in_hydra():
    assert load("actor_rollout_ref.rollout.n=5", "actor_rollout_ref.rollout.n=6").rollout.n == 6


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "actor_rollout_ref.actor.optim.lrr=1e-6",
            "unknown key 'actor_rollout_ref.actor.optim.lrr': neither a megarl key nor a verl key megarl knows; "
            "did you mean 'actor_rollout_ref.actor.optim.lr'? (docs/verl-migration.md lists verl's keys and their "
            "megarl names)",
        ),
        (
            "trainer.save_frq=5",
            "unknown key 'trainer.save_frq' — did you mean verl's 'trainer.save_freq' "
            "(megarl: trainer.save_every)?",
        ),
        (
            "actor_rollout_ref.model.lora.lora_B_init_method=kaiming",
            "actor_rollout_ref.model.lora.lora_B_init_method=kaiming: megarl's lora_B starts at zero",
        ),
        (
            "trainer.critic_warmup=3",
            "trainer.critic_warmup=3: megarl has no critic warm-up (the actor updates from "
            "step 1); remove trainer.critic_warmup",
        ),
        (
            "~trainer.save_freq",
            "override '~trainer.save_freq': hydra's ~key (delete a key) has no meaning in "
            "megarl; leave the key out, or set it to its default",
        ),
        ("trainer.logger=[console,mlflow]", "logging.backends=[console, mlflow] is invalid"),
    ],
)
def test_verl_keys_megarl_cannot_honour_stop_the_load_naming_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load(override)
    assert message in str(e.value)


def test_save_freq_is_translated_not_answered_with_a_wrong_hint():
    cfg = load("trainer.save_freq=20", "trainer.test_freq=5", "data.val_files=/d/val.parquet")
    assert (cfg.trainer.save_every, cfg.trainer.eval_every) == (20, 5)


def test_adv_estimator_alone_picks_the_algorithm_as_in_verl():
    # the GRPO config (algorithm.name=grpo) with verl's estimator on the command line: PPO with a critic
    cfg = load("algorithm.adv_estimator=gae", path=QUICKSTART)
    assert (cfg.algorithm.name, cfg.algorithm.adv_estimator, cfg.critic.enable) == ("ppo", "gae", True)
    assert load("algorithm.adv_estimator=rloo", path=QUICKSTART).algorithm.name == "ppo"
    assert load("algorithm.adv_estimator=drgrpo", "rollout.n=4").algorithm.name == "grpo"
    # both given on the command line: megarl's rule, a contradiction is an error
    with pytest.raises(ConfigError, match="algorithm.adv_estimator=gae contradicts algorithm.name=grpo"):
        load("algorithm.name=grpo", "algorithm.adv_estimator=gae")


def test_a_yaml_file_in_verls_keys_is_translated(tmp_path):
    path = tmp_path / "verl.yaml"
    tree = {
        "actor_rollout_ref": {
            "model": {"path": "/m", "use_remove_padding": True},
            "actor": {"optim": {"lr": 2e-6}, "ppo_mini_batch_size": 8},
            "rollout": {"n": 4, "tensor_model_parallel_size": 1},
        },
        "algorithm": {"adv_estimator": "grpo", "kl_ctrl": {"kl_coef": 0.002}},
        "trainer": {"save_freq": 10, "total_epochs": 2},
    }
    path.write_text(yaml.safe_dump(tree))
    cfg = load(path=path)
    assert (cfg.model.path, cfg.actor.optimizer.lr, cfg.algorithm.ppo_mini_batch_size) == ("/m", 2e-6, 8)
    assert (cfg.rollout.n, cfg.algorithm.kl_coef, cfg.trainer.save_every) == (4, 0.002, 10)
    assert settings_as_megarl(path, ["trainer.test_freq=2"]) == {
        "model": {"path": "/m"},
        "actor": {"optimizer": {"lr": 2e-6}},
        "algorithm": {"ppo_mini_batch_size": 8, "adv_estimator": "grpo", "kl_coef": 0.002},
        "rollout": {"n": 4, "tp": 1},
        "trainer": {"save_every": 10, "total_epochs": 2, "eval_every": 2},
    }


@pytest.fixture(scope="module")
def verl_paths(tmp_path_factory) -> dict[str, str]:
    """A model directory (config.json of a tiny Llama with room for the scripts' lengths and TPs) and
    parquet files in verl's GSM8K schema: what the scripts' paths become."""
    root = tmp_path_factory.mktemp("verl")
    model = write_model_config(root / "model", {**TINY_LLAMA, "max_position_embeddings": 4096})
    files = {
        name: write_parquet(root / f"{name}.parquet", [verl_row("1+1?", "2")])
        for name in ("train", "test", "math_train", "math_test")
    }
    return {"model": str(model), **files}


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_verls_example_scripts_pass_config_show_as_shipped(script, verl_paths, capsys):
    """Each script's overrides, only the paths changed, with every check (the files, the model's heads and
    positions, this machine) on."""
    overrides = with_paths(SCRIPTS[script], **verl_paths)
    code = main(["config", "show", "--as-megarl", *overrides])
    out, err = capsys.readouterr()
    assert code == 0, err
    shown = yaml.safe_load(out)
    assert shown["model"]["path"] == verl_paths["model"]
    assert shown["data"]["train_batch_size"] == 1024 and shown["trainer"]["total_epochs"] == 15
    assert shown["trainer"]["n_devices_per_node"] == 8 and shown["logging"]["backends"] == [
        "console",
        "wandb",
    ]
    assert shown["algorithm"]["ppo_mini_batch_size"] == 256
    ignored = [line for line in err.splitlines() if line.startswith("megarl: ignoring verl's ")]
    assert ignored and all(": " in line[len("megarl: ignoring verl's ") :] for line in ignored)
    assert "megarl config: error" not in err


def test_the_ppo_script_runs_ppo_with_a_critic_and_the_megatron_script_keeps_its_layout(verl_paths):
    ppo = load_config(None, with_paths(SCRIPTS["examples/ppo_trainer/run_deepseek7b_llm.sh"], **verl_paths))
    assert (ppo.algorithm.name, ppo.critic.enable, ppo.critic.optimizer.lr) == ("ppo", True, 1e-5)
    assert (ppo.critic.model_path, ppo.critic.micro_batch_size) == (verl_paths["model"], 32)
    # verl's FSDP actor has no TP; megarl's generation TP must divide the training TP
    assert (ppo.rollout.tp, ppo.actor.parallel.tp) == (4, 4)
    meg = load_config(
        None, with_paths(SCRIPTS["examples/grpo_trainer/run_qwen2-7b_math_megatron.sh"], **verl_paths)
    )
    assert (meg.actor.parallel.tp, meg.actor.parallel.pp, meg.rollout.tp) == (2, 2, 2)
    assert meg.data.train_files == [verl_paths["train"], verl_paths["math_train"]]
    assert meg.algorithm.name == "grpo" and meg.algorithm.use_kl_loss


def test_verls_command_line_runs_without_a_config_file_and_hydra_flags_are_noted(capsys):
    code = main(
        [
            "config",
            "show",
            "--config-path=config",
            "--config-name=ppo_megatron_trainer.yaml",
            "--no-check-paths",
            "actor_rollout_ref.rollout.n=3",
            "algorithm.adv_estimator=rloo",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert yaml.safe_load(out)["rollout"]["n"] == 3
    assert (
        "megarl: ignoring verl's --config-name=ppo_megatron_trainer.yaml: megarl starts from its own defaults"
        in err
    )


def test_the_migration_docs_tables_are_the_translation_table(capsys):
    """docs/verl-migration.md lists exactly VERL_KEYS (regenerate with tools/verl_migration_table.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("table", REPO / "tools" / "verl_migration_table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    capsys.readouterr()
    table.main()
    generated = capsys.readouterr().out
    doc = (REPO / "docs" / "verl-migration.md").read_text()
    assert generated.strip() in doc
    rows = re.findall(r"^\| `([^`]+)` \| ", doc.split("## The keys", 1)[1], flags=re.M)
    assert rows == [k.verl for k in VERL_KEYS if k.megarl is not None] + [
        k.verl for k in VERL_KEYS if k.megarl is None
    ]


def test_megarl_train_takes_a_verl_command_line_without_a_config_file(capsys):
    """`python3 -m verl.trainer.main_ppo` replaced by `megarl train`: overrides only; a bad key stops it
    before any process starts (exit 2), naming verl's key."""
    code = main(["train", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.optim.lrr=1e-6"])
    err = capsys.readouterr().err
    assert code == 2
    assert "megarl train: error: invalid megarl config (1 problem):" in err
    assert "did you mean 'actor_rollout_ref.actor.optim.lr'?" in err
