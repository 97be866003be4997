"""The error probe's cases of what a user sets: config files and keys, the parallel layout and batch sizes,
the model (C, L, M)."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.error_probe import (
    SFT,
    Case,
    Workspace,
)


def _yaml(ws: Workspace, text: str) -> str:
    return str(ws.file("config.yaml", text))


def _bad_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "actor:\n  parallel: {tp: 2\nrollout:\n  n: 8\n"), "--no-check-paths"]


def _list_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "- actor\n- rollout\n"), "--no-check-paths"]


def _typo_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "rollout:\n  temprature: 0.7\n"), "--no-check-paths"]


def _tab_yaml(ws: Workspace) -> list[str]:
    return ["config", "show", _yaml(ws, "rollout:\n\tn: 8\n"), "--no-check-paths"]


def _broken_config(ws: Workspace) -> Path:
    m = ws.model_copy("m")
    (m / "config.json").write_text('{"model_type": "llama",')
    return m


CONFIG_CASES: list[Case] = [
    # --- config files and keys (`megarl config show` loads exactly as `megarl train` does) ---
    Case(
        "C01",
        "config",
        "YAML syntax error (an unclosed `{`)",
        _bad_yaml,
        ("is not valid YAML", "line 2, column 13", "fix the syntax"),
        2,
    ),
    Case(
        "C02", "config", "a tab indenting a YAML key", _tab_yaml, ("is not valid YAML", "line 2, column 1"), 2
    ),
    Case(
        "C03",
        "config",
        "a config file that is a YAML list",
        _list_yaml,
        ("must be a mapping of sections",),
        2,
    ),
    Case(
        "C04",
        "config",
        "the config file's path mistyped",
        lambda ws: ["config", "show", str(ws.case_dir / "quickstrat.yaml")],
        ("quickstrat.yaml does not exist; check the path",),
        2,
    ),
    Case(
        "C05",
        "config",
        "a misspelled key in the YAML (`rollout.temprature`)",
        _typo_yaml,
        ("unknown key 'rollout.temprature' — did you mean 'rollout.temperature'?",),
        2,
    ),
    Case(
        "C06",
        "config",
        "a misspelled override (`actor.paralel.tp=2`)",
        lambda ws: ws.show("actor.paralel.tp=2"),
        ("unknown key 'actor.paralel' — did you mean 'actor.parallel'?",),
        2,
    ),
    Case(
        "C07",
        "config",
        "a key at the wrong level (`tp=2`)",
        lambda ws: ws.show("tp=2"),
        ("unknown key 'tp' — did you mean 'actor.parallel.tp'",),
        2,
    ),
    Case(
        "C08",
        "config",
        "a misspelled verl key (`actor_rollout_ref.actor.optim.lrr=1e-6`; verl's own keys are translated)",
        lambda ws: ws.show("actor_rollout_ref.actor.optim.lrr=1e-6"),
        (
            "unknown key 'actor_rollout_ref.actor.optim.lrr': neither a megarl key nor a verl key megarl knows; "
            "did you mean 'actor_rollout_ref.actor.optim.lr'?",
        ),
        2,
    ),
    Case(
        "C09",
        "config",
        "a word for a number (`actor.parallel.tp=two`)",
        lambda ws: ws.show("actor.parallel.tp=two"),
        ("actor.parallel.tp=two is invalid: expected an integer; e.g. actor.parallel.tp=1",),
        2,
    ),
    Case(
        "C10",
        "config",
        "a list for a number (`rollout.n=[8]`)",
        lambda ws: ws.show("rollout.n=[8]"),
        ("rollout.n=[8] is invalid: expected an integer",),
        2,
    ),
    Case(
        "C11",
        "config",
        "a number for a list of files (`data.train_files=5`)",
        lambda ws: ws.show("data.train_files=5"),
        ("data.train_files=5 is invalid: expected a list (each item a string)",),
        2,
    ),
    Case(
        "C12",
        "config",
        "a bad choice (`algorithm.adv_estimator=grp`)",
        lambda ws: ws.show("algorithm.adv_estimator=grp"),
        ("algorithm.adv_estimator=grp is invalid: expected one of gae, grpo,",),
        2,
    ),
    Case(
        "C13",
        "config",
        "a bad launcher (`trainer.launcher=slurm`)",
        lambda ws: ws.show("trainer.launcher=slurm"),
        ("trainer.launcher=slurm is invalid: expected one of ray, torchrun",),
        2,
    ),
    Case(
        "C14",
        "config",
        "a word for a boolean (`trainer.val_before_train=maybe`)",
        lambda ws: ws.show("trainer.val_before_train=maybe"),
        ("expected true or false",),
        2,
    ),
    Case(
        "C15",
        "config",
        "a value for a section (`actor=3`)",
        lambda ws: ws.show("actor=3"),
        ("actor is a section, not a value; set its keys (parallel,",),
        2,
    ),
    Case(
        "C16",
        "config",
        "an override without `=` (`actor.parallel.tp`)",
        lambda ws: ws.show("actor.parallel.tp"),
        ("override 'actor.parallel.tp' is not key=value",),
        2,
    ),
    Case(
        "C17",
        "config",
        "a `${...}` reference to a key that does not exist",
        lambda ws: ws.show("trainer.output_dir=${data.nope}"),
        ("trainer.output_dir: Interpolation key 'data.nope' not found; fix the ${...} reference",),
        2,
    ),
    Case(
        "C18",
        "config",
        "a negative learning rate",
        lambda ws: ws.show("actor.optimizer.lr=-1e-6"),
        ("actor.optimizer.lr=-1e-06 must be > 0",),
        2,
    ),
    Case(
        "C19", "config", "`rollout.n=0`", lambda ws: ws.show("rollout.n=0"), ("rollout.n=0 must be ≥ 1",), 2
    ),
    Case(
        "C20",
        "config",
        "an unknown logging backend (`logging.backends=[consol]`)",
        lambda ws: ws.show("logging.backends=[consol]"),
        ("each item one of console, jsonl, tensorboard, wandb",),
        2,
    ),
    Case(
        "C21",
        "config",
        "an SFT config given to `megarl train`",
        lambda ws: ws.train(f"data.train_files=[{ws.data / 'sft.parquet'}]", config=SFT),
        ("algorithm.name=sft is not RL training; run `megarl sft",),
        2,
    ),
    # --- parallel layout and batch sizes ---
    Case(
        "L01",
        "layout",
        "TP not dividing the heads (`actor.parallel.tp=3`, 4 heads)",
        lambda ws: ws.show("actor.parallel.tp=3", "trainer.n_devices_per_node=3"),
        (
            "actor.parallel.tp=3 does not divide num_attention_heads=4 and num_key_value_heads=2; use one of 1, 2",
        ),
        2,
    ),
    Case(
        "L02",
        "layout",
        "PP not dividing the layers (`actor.parallel.pp=3`, 4 layers)",
        lambda ws: ws.show("actor.parallel.pp=3", "trainer.n_devices_per_node=3"),
        ("actor.parallel.pp=3 does not divide num_hidden_layers=4; use one of 1, 2, 4",),
        2,
    ),
    Case(
        "L03",
        "layout",
        "a world size TP×PP does not divide (3 ranks, TP 2)",
        lambda ws: ws.show("actor.parallel.tp=2", "trainer.n_devices_per_node=3"),
        ("tp·pp·cp = 2·1·1 = 2 does not divide the 3 devices of the actor",),
        2,
    ),
    Case(
        "L04",
        "layout",
        "a rollout TP the actor's TP does not divide (`rollout.tp=3`)",
        lambda ws: ws.show("rollout.tp=3"),
        ("rollout.tp=3 does not divide actor.parallel.tp=1",),
        2,
    ),
    Case(
        "L05",
        "layout",
        "train_batch_size not divisible by ppo_mini_batch_size",
        lambda ws: ws.show("data.train_batch_size=12", "algorithm.ppo_mini_batch_size=8"),
        ("algorithm.ppo_mini_batch_size=8 does not divide data.train_batch_size=12",),
        2,
    ),
    Case(
        "L06",
        "layout",
        "the mini-batch's sequences per DP rank not divisible by micro_batch_size",
        lambda ws: ws.show("algorithm.ppo_mini_batch_size=16", "actor.micro_batch_size=3"),
        ("actor.micro_batch_size=3 does not divide the 64 sequences each actor data-parallel rank gets",),
        2,
    ),
    Case(
        "L07",
        "layout",
        "a mini-batch larger than the train batch",
        lambda ws: ws.show("data.train_batch_size=8", "algorithm.ppo_mini_batch_size=16"),
        ("algorithm.ppo_mini_batch_size=16 exceeds data.train_batch_size=8",),
        2,
    ),
    Case(
        "L08",
        "layout",
        "`trainer.n_devices_per_node=0`",
        lambda ws: ws.show("trainer.n_devices_per_node=0"),
        ("trainer.n_devices_per_node=0 must be ≥ 1",),
        2,
    ),
    Case(
        "L09",
        "layout",
        "virtual pipeline without PP (`actor.parallel.vpp=2`)",
        lambda ws: ws.show("actor.parallel.vpp=2"),
        ("actor.parallel.vpp=2 needs actor.parallel.pp > 1",),
        2,
    ),
    # --- the model ---
    Case(
        "M01",
        "model",
        "model.path mistyped",
        lambda ws: ws.show(f"model.path={ws.case_dir / 'Qwen2.5-0.5B'}"),
        ("Qwen2.5-0.5B does not exist; point it at a Hugging Face checkpoint directory",),
        2,
    ),
    Case(
        "M02",
        "model",
        "a model dir without config.json",
        lambda ws: ws.show(f"model.path={ws.model_copy('m', drop=('config.json',))}"),
        ("has no config.json",),
        2,
    ),
    Case(
        "M03",
        "model",
        "a model dir without its tokenizer files (fixed: was transformers' ValueError traceback)",
        lambda ws: ws.train(
            f"model.path={ws.model_copy('m', drop=('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja'))}"
        ),
        (
            "model.path=<case>/m holds no tokenizer transformers can load",
            "it has: config.json, generation_config.json, model.safetensors",
            "set model.tokenizer_path",
        ),
        2,
    ),
    Case(
        "M04",
        "model",
        "model.tokenizer_path mistyped",
        lambda ws: ws.show(f"model.tokenizer_path={ws.case_dir / 'tok'}"),
        ("model.tokenizer_path=<case>/tok does not exist",),
        2,
    ),
    Case(
        "M05",
        "model",
        "a config.json that is not JSON",
        lambda ws: ws.show(f"model.path={_broken_config(ws)}"),
        ("config.json is unreadable (JSONDecodeError", "fix or re-export it"),
        2,
    ),
    Case(
        "M06",
        "model",
        "a model megarl does not build (gpt2) (fixed: was accepted until the workers failed)",
        lambda ws: ws.show(
            f"model.path={ws.model_copy('m', config={'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel']})}"
        ),
        (
            "is a 'gpt2' model (model_type in its config.json), which megarl does not build; use a checkpoint of one of llama, mistral, qwen2, qwen3",
        ),
        2,
    ),
    Case(
        "M07",
        "model",
        "model.path naming the weights file (fixed: was 'does not exist')",
        lambda ws: ws.show(f"model.path={ws.model / 'model.safetensors'}"),
        (
            "model.safetensors is a file; point it at the Hugging Face checkpoint directory",
            "(e.g. model.path=<tmp>/model)",
        ),
        2,
    ),
]
