"""`<role>.lora` in the config: both of verl's LoRA vocabularies land on it, every problem is reported at
once with its fix (megarl.config.lora_checks), a PEFT adapter to start from must match the config, and
the role specs carry the adapters of the trained roles only."""

import json

import pytest

from megarl.config import ConfigError, load_config
from megarl.config.lora_checks import adapter_problems, check_lora
from megarl.config.roles import role_spec
from megarl.config.schema import MegarlConfig
from megarl.config.schema_lora import LoraConfig

pytestmark = pytest.mark.unit

M = "actor_rollout_ref.model"


def load(*overrides: str) -> MegarlConfig:
    return load_config(None, ["model.path=/m", *overrides], check_paths=False)


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(*overrides)
    return info.value.problems


@pytest.mark.parametrize(
    ("overrides", "role", "expected"),
    [
        (  # verl's FSDP LoRA: flat keys of the model
            [f"{M}.lora_rank=32", f"{M}.lora_alpha=16", f"{M}.target_modules=all-linear"],
            "actor",
            {"rank": 32, "alpha": 16.0, "target_modules": ["all-linear"]},
        ),
        (
            [f"{M}.lora_rank=8", f"{M}.exclude_modules=[o_proj]", f"{M}.lora_adapter_path=/a"],
            "actor",
            {"rank": 8, "exclude_modules": ["o_proj"], "adapter_path": "/a"},
        ),
        (  # verl's Megatron LoRA: the model's lora section
            [
                f"{M}.lora.rank=16",
                f"{M}.lora.alpha=8",
                f"{M}.lora.dropout=0.05",
                f"{M}.lora.target_modules=[linear_qkv,linear_fc2]",
                f"{M}.lora.merge=true",
                f"{M}.lora.lora_A_init_method=xavier",
                f"{M}.lora.type=lora",
                f"{M}.lora.lora_B_init_method=zero",
            ],
            "actor",
            {
                "rank": 16,
                "alpha": 8.0,
                "dropout": 0.05,
                "target_modules": ["linear_qkv", "linear_fc2"],
                "sync": "merged",
                "init_A": "xavier",
            },
        ),
        (  # canonical_lora's names are PEFT's here; merge=false keeps auto
            [
                f"{M}.lora.rank=4",
                f"{M}.lora.type=canonical_lora",
                f"{M}.lora.target_modules=[linear_q,linear_v,linear_fc1_gate,linear_fc1_up,linear_proj]",
                f"{M}.lora.merge=false",
            ],
            "actor",
            {"target_modules": ["q_proj", "v_proj", "gate_proj", "up_proj", "linear_proj"], "sync": "auto"},
        ),
        (  # Megatron-Bridge's empty target list with exclusions: every linear but those
            [f"{M}.lora.rank=4", f"{M}.lora.target_modules=[]", f"{M}.lora.exclude_modules=[linear_fc1]"],
            "actor",
            {"target_modules": ["all-linear"], "exclude_modules": ["linear_fc1"]},
        ),
        (
            [f"{M}.lora.rank=4", f"{M}.lora.lora_A_init_method=uniform"],  # Megatron-Bridge: kaiming
            "actor",
            {"init_A": "kaiming"},
        ),
        (["critic.model.lora_rank=8", "critic.model.lora_alpha=16"], "critic", {"rank": 8, "alpha": 16.0}),
        (
            ["critic.model.lora.rank=8", "critic.model.lora.dropout=0.1"],
            "critic",
            {"rank": 8, "dropout": 0.1},
        ),
    ],
)
def test_both_verl_lora_vocabularies_set_the_roles_lora(overrides, role, expected):
    lora = getattr(load(*overrides), role).lora
    assert {k: getattr(lora, k) for k in expected} == expected


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            f"{M}.lora.type=dora",
            f"{M}.lora.type=dora: megarl's LoRA is plain LoRA on the text decoder (no DoRA, no vision LoRA); "
            "use lora",
        ),
        (
            f"{M}.lora.lora_B_init_method=gaussian",
            f"{M}.lora.lora_B_init_method=gaussian: megarl's lora_B starts at zero (a new adapter leaves the "
            "model unchanged); use zero",
        ),
        (
            f"{M}.lora.dropout_position=post",
            f"{M}.lora.dropout_position=post: megarl's dropout is on the adapter's input (PEFT's); use pre",
        ),
        (
            "critic.model.lora.type=vlm_lora",
            "critic.model.lora.type=vlm_lora: megarl's LoRA is plain LoRA on the text decoder (no DoRA, no "
            "vision LoRA); use lora",
        ),
    ],
)
def test_verl_lora_values_megarl_cannot_honour_stop_the_load(override, message):
    assert message in problems(override)


def test_the_two_verl_vocabularies_setting_one_key_differently_is_an_error_naming_both():
    assert problems(f"{M}.lora_rank=8", f"{M}.lora.rank=16") == [
        f"{M}.lora_rank=8 and {M}.lora.rank=16 both set actor.lora.rank, differently; keep one of them"
    ]


def test_harmless_verl_lora_keys_are_ignored_with_a_warning(capsys):
    capsys.readouterr()
    load(f"{M}.lora.a2a_experimental=true", f"{M}.lora.freeze_vision_model=true", f"{M}.lora.dtype=null")
    err = capsys.readouterr().err
    assert f"megarl: ignoring verl's {M}.lora.a2a_experimental=true: " in err
    assert f"megarl: ignoring verl's {M}.lora.freeze_vision_model=true: megarl trains text decoders" in err
    assert f"megarl: ignoring verl's {M}.lora.dtype=null: megarl's adapters are in model.dtype" in err


def test_every_bad_lora_value_is_reported_at_once_with_its_fix():
    assert problems(
        "actor.lora.rank=-1",
        "actor.lora.alpha=0",
        "actor.lora.dropout=1.0",
        "actor.lora.target_modules=[q_proj,qkv,'*.layers.0.*',model.layers.1.mlp.up_proj]",
        "actor.lora.exclude_modules=[router]",
    ) == [
        "actor.lora.rank=-1 must be ≥ 0; e.g. 32 (0 = off)",
        "actor.lora.alpha=0.0 must be > 0 (scaling = alpha / rank); e.g. 32",
        "actor.lora.dropout=1.0 must be in [0, 1); e.g. 0.0 (off) or 0.05",
        "actor.lora.target_modules has 'qkv': an entry is one of all-linear, q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj, linear_qkv, linear_proj, linear_fc1, linear_fc2, or a pattern over "
        "full module names (with * or .), e.g. '*.layers.0.*.linear_qkv'",
        "actor.lora.exclude_modules has 'router': an entry is one of all-linear, q_proj, k_proj, v_proj, "
        "o_proj, gate_proj, up_proj, down_proj, linear_qkv, linear_proj, linear_fc1, linear_fc2, or a pattern "
        "over full module names (with * or .), e.g. '*.layers.0.*.linear_qkv'",
    ]
    assert problems("actor.lora.rank=8", "actor.lora.target_modules=[]") == [
        "actor.lora.target_modules is empty, so no projection gets an adapter; use [all-linear] "
        "(exclude_modules takes projections out of it)"
    ]
    assert problems("actor.lora.sync=both") == [
        "actor.lora.sync=both is invalid: expected one of auto, adapter, merged; e.g. actor.lora.sync=auto"
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor.backend=fsdp"],
            "actor.lora.rank=8 with actor.backend=fsdp: megarl's FSDP backend has no LoRA yet; use "
            "actor.backend=megatron or actor.lora.rank=0",
        ),
        (
            ["rollout.placement=separate", "rollout.n_devices=1", "trainer.n_devices_per_node=2"],
            "actor.lora.rank=8 with rollout.placement=separate: LoRA syncs adapters into colocated engines "
            "only, not yet into an engines' pool of their own; set rollout.placement=colocated, or "
            "actor.lora.rank=0",
        ),
        (
            ["async_training.max_staleness=1", "async_training.partial_rollout=true"],
            "actor.lora.rank=8 with async_training.max_staleness=1, async_training.partial_rollout=true: LoRA "
            "syncs adapters into colocated engines only, not yet into an engines' pool of their own; set "
            "async_training.max_staleness=0 and async_training.partial_rollout=false, or actor.lora.rank=0",
        ),
        (
            ["algorithm.use_kl_loss=true", "trainer.n_devices_per_node=2", "ref.devices=[cpu:1]"],
            "actor.lora.rank=8: the reference is the actor with its adapters off (no second model), so "
            "ref.devices cannot apply; remove ref.devices, or set actor.lora.rank=0 for a reference model "
            "of its own",
        ),
        (
            ["actor.lora.rank=0", "actor.lora.adapter_path=/a"],
            "actor.lora.adapter_path=/a is set but actor.lora.rank=0 (LoRA off); set actor.lora.rank and "
            "actor.lora.alpha to the adapter's r and lora_alpha, or remove adapter_path",
        ),
        (
            ["algorithm.adv_estimator=gae", "critic.lora.rank=4", "critic.backend=fsdp"],
            "critic.lora.rank=4 with critic.backend=fsdp: megarl's FSDP backend has no LoRA yet; use "
            "critic.backend=megatron or critic.lora.rank=0",
        ),
    ],
)
def test_what_lora_does_not_run_with_yet_is_refused_with_the_fix(overrides, message):
    assert message in problems("actor.lora.rank=8", *overrides)


def test_the_trained_roles_specs_carry_their_adapters_and_the_reference_none():
    cfg = load(
        "actor.lora.rank=16",
        "critic.lora.rank=4",
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_loss=true",
    )
    assert role_spec(cfg, "actor").lora == cfg.actor.lora and role_spec(cfg, "actor").lora.rank == 16
    assert role_spec(cfg, "critic").lora.rank == 4
    assert role_spec(cfg, "ref").lora is None
    assert role_spec(load(), "actor").lora is None  # rank 0: full training


PEFT_CONFIG = {  # what peft 0.21's LoraConfig(r=8, lora_alpha=16, target_modules=[q_proj, v_proj]) saves
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["v_proj", "q_proj"],
    "bias": "none",
    "lora_bias": False,
    "use_rslora": False,
    "use_dora": False,
    "modules_to_save": None,
    "rank_pattern": {},
    "alpha_pattern": {},
    "target_parameters": None,
}


@pytest.mark.parametrize(
    ("lora", "changes", "expected"),
    [
        ({}, {}, []),
        ({"target_modules": ["linear_qkv"]}, {"target_modules": "all-linear"}, ["does not target"]),
        ({"target_modules": ["*.layers.0.*"]}, {}, []),  # a pattern may: the load checks each tensor
        (
            {"exclude_modules": ["q_proj"]},
            {},
            ["it holds adapters for q_proj, which actor.lora.target_modules"],
        ),
        ({"rank": 16}, {}, ["set actor.lora.rank=8 actor.lora.alpha=16"]),
        (
            {},
            {"target_modules": ["q_proj", "lm_head"]},
            ["it adapts lm_head, but megarl's adapters are on q_proj"],
        ),
        (
            {},
            {"use_dora": True, "modules_to_save": ["score"]},
            ["its use_dora=true (DoRA)", "its modules_to_save"],
        ),
        ({}, {"peft_type": "IA3"}, ["its peft_type is IA3; megarl loads LoRA adapters only"]),
    ],
)
def test_a_peft_adapter_must_be_what_the_lora_config_describes(lora, changes, expected):
    lora = LoraConfig(**{"rank": 8, "alpha": 16.0, **lora})
    found = adapter_problems("actor.lora", lora, {**PEFT_CONFIG, **changes})
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found, strict=True)), found


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (None, "does not exist; point it at a PEFT adapter directory"),
        (
            ["adapter_config.json", "adapter_model.bin"],
            "has no adapter_model.safetensors; megarl reads safetensors",
        ),
        (
            ["adapter_model.safetensors"],
            "has no adapter_config.json; point it at what PeftModel.save_pretrained",
        ),
        (["adapter_config.json", "adapter_model.safetensors"], None),
    ],
)
def test_the_adapter_directory_holds_peft_files(tmp_path, files, message):
    adapter = tmp_path / "adapter"
    if files is not None:
        adapter.mkdir()
        for name in files:
            (adapter / name).write_text(json.dumps(PEFT_CONFIG))
    cfg = MegarlConfig()
    cfg.actor.lora = LoraConfig(rank=8, alpha=16, adapter_path=str(adapter))
    found: list[str] = []
    check_lora(cfg, found)
    if message is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(f"actor.lora.adapter_path={adapter} ")
        assert message in found[0]
