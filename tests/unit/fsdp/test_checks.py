"""Load-time checks of a role's model for the FSDP backend: one refusal per way a checkpoint cannot fill
its role, each naming the role and the model, and the tiny architectures megarl builds passing in every
role. Only config.json is written: the checks build the model on the meta device."""

from __future__ import annotations

import json
import sys

import pytest
import transformers

from megarl.config.errors import ConfigError
from megarl.fsdp.checks import (
    UnusableModelError,
    check_actor_model,
    check_critic_model,
    check_reference_model,
    check_reward_model,
    vllm_architectures,
)
from megarl.models.tiny import ALL_TINY_FAMILIES, tiny_config

pytestmark = pytest.mark.unit

SMALL = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
# the tiny tokenizer's ids (megarl.models.tiny.build_tiny_hf sets them); Phi-3's default pad id is 32000
TOKEN_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CHECKS = {
    "actor": check_actor_model,
    "reference": check_reference_model,
    "critic": check_critic_model,
    "reward": check_reward_model,
}


def model_dir(tmp_path, config: transformers.PretrainedConfig, architecture: str | None) -> str:
    config.architectures = [architecture] if architecture else None
    config.save_pretrained(tmp_path)
    return str(tmp_path)


def refusal(check, role: str, path: str) -> list[str]:
    with pytest.raises(UnusableModelError) as caught:
        check(role, path)
    assert isinstance(caught.value, ConfigError)  # exit code 2: refused before training
    assert all(p.startswith(f"{role}: ") and path in p for p in caught.value.problems)
    return caught.value.problems


@pytest.mark.parametrize("family", sorted(ALL_TINY_FAMILIES))
@pytest.mark.parametrize("role", sorted(CHECKS))
def test_tiny_families_pass_in_every_role(tmp_path, family, role):
    config = tiny_config(family, num_hidden_layers=1, **TOKEN_IDS)
    heads = {
        "actor": "ForCausalLM",
        "reference": "ForCausalLM",
        "critic": "ForTokenClassification",
        "reward": "ForSequenceClassification",
    }
    architecture = type(config).__name__.replace("Config", heads[role])
    CHECKS[role](role, model_dir(tmp_path, config, architecture))


def test_actor_of_an_architecture_vllm_lacks_is_refused(tmp_path):
    path = model_dir(tmp_path, tiny_config("llama", num_hidden_layers=1), "FooForCausalLM")
    [problem] = refusal(check_actor_model, "actor", path)
    assert problem.startswith(
        f"actor: model {path} (FooForCausalLM): vLLM 0.32.0 has no model class for this architecture, "
        "so the actor cannot generate with it; use an architecture vLLM runs"
    )


def test_actor_vllm_runs_only_through_its_transformers_fallback_is_refused(tmp_path):
    path = model_dir(tmp_path, transformers.Olmo2Config(**SMALL), "Olmo2ForCausalLM")
    [problem] = refusal(check_actor_model, "actor", path)
    assert "runs this architecture only through its transformers fallback" in problem
    assert "the actor's FSDP model beside the engine would fail" in problem


def test_reference_needs_no_vllm_model_class(tmp_path):
    path = model_dir(tmp_path, transformers.Olmo2Config(**SMALL), "Olmo2ForCausalLM")
    check_reference_model("reference", path)


def test_reference_without_a_causal_lm_class_is_refused(tmp_path):
    config = transformers.DistilBertConfig(dim=64, n_layers=1, n_heads=2, hidden_dim=64)
    path = model_dir(tmp_path, config, "DistilBertForMaskedLM")
    [problem] = refusal(check_reference_model, "reference", path)
    assert "has no causal-LM class" in problem


def test_actor_without_architectures_is_told_what_to_add(tmp_path):
    path = model_dir(tmp_path, tiny_config("llama", num_hidden_layers=1), None)
    [problem] = refusal(check_actor_model, "actor", path)
    assert problem.endswith('add it (e.g. "architectures": ["LlamaForCausalLM"])')


def test_actor_fsdp_cannot_wrap_a_class_without_decoder_layers(tmp_path):
    path = model_dir(tmp_path, transformers.BioGptConfig(**SMALL, vocab_size=100), "BioGptForCausalLM")
    fsdp, vllm = refusal(check_actor_model, "actor", path)
    assert fsdp.startswith(
        f"actor: FSDP cannot wrap model {path}: its class BioGptForCausalLM names no decoder-layer classes "
        "(_no_split_modules is empty in transformers"
    )
    assert "vLLM 0.32.0 has no model class" in vllm


@pytest.mark.parametrize(
    ("config", "architecture"),
    [
        (
            transformers.DistilBertConfig(dim=64, n_layers=1, n_heads=2, hidden_dim=64),
            "DistilBertForMaskedLM",
        ),
        (transformers.T5Config(d_model=64, num_layers=1, num_heads=2, d_ff=64), "T5ForConditionalGeneration"),
    ],
    ids=["encoder-only", "encoder-decoder"],
)
def test_actor_without_a_causal_lm_class_is_refused(tmp_path, config, architecture):
    path = model_dir(tmp_path, config, architecture)
    causal, vllm = refusal(check_actor_model, "actor", path)
    assert causal.startswith(
        f"actor: model {path} ({architecture}, model_type {config.model_type}) has no causal-LM class in "
        f"transformers {transformers.__version__} (AutoModelForCausalLM does not know {config.model_type}), "
        "so it cannot generate or score tokens; use a decoder-only checkpoint"
    )
    assert "vLLM 0.32.0 has no model class" in vllm


def test_critic_without_a_token_classification_class_is_refused(tmp_path):
    path = model_dir(tmp_path, transformers.Olmo2Config(**SMALL), "Olmo2ForCausalLM")
    [problem] = refusal(check_critic_model, "critic", path)
    assert problem.startswith(
        f"critic: model {path} (Olmo2ForCausalLM, model_type olmo2) has no token-classification class in "
        f"transformers {transformers.__version__} (AutoModelForTokenClassification does not know olmo2), "
        "which megarl builds the critic's value head on"
    )


def test_critic_fsdp_cannot_wrap_a_class_without_decoder_layers(tmp_path):
    path = model_dir(tmp_path, transformers.BioGptConfig(**SMALL, vocab_size=100), "BioGptForCausalLM")
    [problem] = refusal(check_critic_model, "critic", path)
    assert problem.startswith(
        f"critic: FSDP cannot wrap model {path}: its class BioGptForTokenClassification"
    )


def test_reward_model_without_a_sequence_classification_class_is_refused(tmp_path):
    path = model_dir(tmp_path, transformers.GraniteConfig(**SMALL), "GraniteForCausalLM")
    [problem] = refusal(check_reward_model, "reward", path)
    assert "has no sequence-classification class" in problem
    assert "AutoModelForSequenceClassification does not know granite" in problem


def test_unknown_model_type_is_refused_naming_transformers(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "foo", "architectures": ["FooForCausalLM"]})
    )
    [problem] = refusal(check_actor_model, "actor", str(tmp_path))
    assert problem.startswith(f"actor: model {tmp_path}: transformers {transformers.__version__} cannot read")
    assert problem.endswith("trust_remote_code=true for a checkpoint that ships its code")


def test_directory_without_config_json_is_refused(tmp_path):
    [problem] = refusal(check_critic_model, "critic", str(tmp_path))
    assert problem == (
        f"critic: model {tmp_path} has no config.json; point it at a Hugging Face checkpoint directory "
        "(config.json + weights)"
    )


def test_vllm_registry_is_read_without_importing_vllm():
    imported = "vllm" in sys.modules
    vllm_architectures.cache_clear()
    vllm = vllm_architectures()
    assert ("vllm" in sys.modules) == imported
    assert vllm is not None and vllm.version == "0.32.0"
    assert {"LlamaForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM"} <= vllm.native
    assert {"Olmo2ForCausalLM", "GPTNeoXForCausalLM"} <= vllm.fallback
    assert not vllm.native & vllm.fallback


def test_a_run_checks_every_fsdp_role_and_reports_them_together(tmp_path):
    """check_fsdp_roles, called before any worker starts: the actor's OLMo 2 has no vLLM class of its own
    and its critic no value head; a Megatron role's model is not its business."""
    from megarl.config import load_config
    from megarl.fsdp.checks import check_fsdp_roles

    path = model_dir(tmp_path, transformers.Olmo2Config(**SMALL), "Olmo2ForCausalLM")
    overrides = [
        f"model.path={path}",
        "actor.backend=fsdp",
        "critic.backend=fsdp",
        "algorithm.adv_estimator=gae",
    ]
    cfg = load_config(None, [*overrides, "algorithm.name=ppo"], check_paths=False)
    with pytest.raises(UnusableModelError) as caught:
        check_fsdp_roles(cfg)
    roles = [p.split(":", 1)[0] for p in caught.value.problems]
    assert roles == ["actor", "critic"], caught.value.problems
    assert "runs this architecture only through its transformers fallback" in caught.value.problems[0]
    cfg.actor.backend = cfg.critic.backend = "megatron"
    check_fsdp_roles(cfg)  # nothing on FSDP: nothing to check here
