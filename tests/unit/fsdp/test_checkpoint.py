"""An FSDP role's checkpoint read in one process: `megarl convert mcore-to-hf`'s export of it, and each
backend's loader refusing the other's checkpoint before touching a model or a process group. Saving and
resuming with FSDP2 ranks is tests/multiproc/test_fsdp_checkpoint.py."""

import json

import pytest
import torch
from safetensors.torch import load_file

from megarl.checkpoint.format import CheckpointError
from tests.helpers.checkpoints import fake_fsdp_checkpoint, fake_megatron_checkpoint

pytestmark = pytest.mark.unit


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: tied embeddings
def test_convert_exports_an_fsdp_checkpoint_in_the_models_own_layout(tiny_models, tmp_path, family):
    from megarl.checkpoint.hf_export import export_checkpoint_hf

    source = tiny_models[family]
    ckpt = fake_fsdp_checkpoint(source, tmp_path / "ckpt")
    result = export_checkpoint_hf(ckpt, tmp_path / "hf")
    assert result["backend"] == "fsdp" and not (tmp_path / "hf.partial").exists()
    original, exported = (
        load_file(source / "model.safetensors"),
        load_file(tmp_path / "hf" / "model.safetensors"),
    )
    assert sorted(exported) == sorted(original)
    assert all(torch.equal(exported[k], v) for k, v in original.items())
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == json.loads((source / "config.json").read_text())["architectures"]
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_an_fsdp_checkpoint_whose_class_transformers_lacks_is_refused(tiny_models, tmp_path):
    from megarl.checkpoint.hf_export import export_checkpoint_hf
    from megarl.checkpoint.manifest import write_manifest

    ckpt = fake_fsdp_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    meta = json.loads((ckpt / "megarl_checkpoint.json").read_text())
    (ckpt / "megarl_checkpoint.json").write_text(json.dumps({**meta, "model_class": "NoSuchForCausalLM"}))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    with pytest.raises(
        CheckpointError, match="holds a NoSuchForCausalLM, which transformers .* does not have"
    ):
        export_checkpoint_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()


def test_the_megatron_loader_refuses_an_fsdp_checkpoint_by_its_backend(tiny_models, tmp_path):
    from megarl.checkpoint.role import load_train_state

    ckpt = fake_fsdp_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    with pytest.raises(CheckpointError) as error:
        load_train_state([], None, ckpt)
    assert str(error.value) == (
        f"{ckpt}: this role's checkpoint was written by the fsdp backend; set actor.backend=fsdp to resume "
        "it (the megatron backend cannot load it)"
    )


def test_the_fsdp_loader_refuses_a_megatron_checkpoint_by_its_backend(tiny_models, tmp_path):
    from megarl.fsdp.checkpoint import load_fsdp_state

    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="written by the megatron backend; set <role>.backend=megatron"):
        load_fsdp_state(torch.nn.Linear(1, 1), None, ckpt)


def test_hf_fingerprint_is_the_same_from_a_config_and_from_its_json(tiny_models, tmp_path):
    from transformers import AutoConfig

    from megarl.checkpoint.role_common import check_hf_fingerprint, hf_fingerprint

    source = tiny_models["qwen2"]
    config = AutoConfig.from_pretrained(source)
    from_json = hf_fingerprint(json.loads((source / "config.json").read_text()))
    assert hf_fingerprint(config) == from_json
    assert from_json["model_type"] == "qwen2" and from_json["tie_word_embeddings"] is True
    wider = {"architecture": {**from_json, "hidden_size": 2 * config.hidden_size, "num_hidden_layers": 9}}
    with pytest.raises(CheckpointError) as error:
        check_hf_fingerprint(wider, config, tmp_path, str(source))
    assert str(error.value) == (
        f"{tmp_path} was saved from a model with hidden_size {2 * config.hidden_size}, num_hidden_layers 9; "
        f"the config's model ({source}) has hidden_size {config.hidden_size}, num_hidden_layers "
        f"{config.num_hidden_layers}; point trainer.resume at a checkpoint of this model or change model.path"
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_dcp_of_other_shapes_or_keys_is_refused_before_reading_a_tensor(tmp_path):
    import torch.distributed.checkpoint as dcp

    from megarl.fsdp.checkpoint import _check_matches

    dcp.save(
        {"embed.weight": torch.zeros(8, 4), "norm.weight": torch.ones(4)},
        checkpoint_id=tmp_path / "model",
        no_dist=True,
    )
    ours = {"embed.weight": torch.zeros(9, 4), "norm.weight": torch.ones(4), "head.weight": torch.zeros(2, 4)}
    with pytest.raises(CheckpointError) as error:
        _check_matches(ours, tmp_path / "model", "model", "tiny")
    assert str(error.value) == (
        f"the model of {tmp_path} does not fit the role's model (tiny): it lacks head.weight; it stores "
        "embed.weight [8, 4] (the model has [9, 4]); resume from a checkpoint of this model"
    )
