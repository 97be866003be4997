"""An FSDP2 role's checkpoint (megarl.fsdp.checkpoint): saved at world 2, resumed bit-exactly at world 2 and
within 1e-5 at world 1, exported in transformers' own layout, and refused whole when damaged —
fsdp_checkpoint_checks in the shared 2-rank launch (world2) and then in the shared 1-rank launch (world1,
loading what world2 saved; tests/multiproc/conftest.py)."""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc


def _world1_argv(request) -> list:
    request.getfixturevalue("shared_launch_2")  # world2 first: world1 loads its checkpoint
    return [*request.getfixturevalue("fsdp_checkpoint_work"), "world1"]


SHARED_PART_2 = (
    "fsdp_checkpoint",
    "tests.multiproc.fsdp_checkpoint_checks",
    lambda request: [*request.getfixturevalue("fsdp_checkpoint_work"), "world2"],
)
SHARED_PART_1 = ("fsdp_checkpoint", "tests.multiproc.fsdp_checkpoint_checks", _world1_argv)


@pytest.fixture(scope="module")
def world2(shared_launch_2):
    return shared_result(shared_launch_2, "fsdp_checkpoint")


@pytest.fixture(scope="module")
def world1(shared_launch_1):
    return shared_result(shared_launch_1, "fsdp_checkpoint")


def test_resume_at_the_saved_world_size_is_bit_exact(world2):
    assert world2["resumed"] == world2["reference"]  # loss, grad norm and lr of step 3, bit for bit
    assert world2["weights_bit_equal"]
    assert world2["weights_moved"] > 1e-4, "the steps barely moved the weights"
    assert world2["rng_equal"]
    report = world2["report"]
    assert report["rng"] == "restored" and report["optimizer"] == "loaded" and report["num_updates"] == 2
    assert world2["extra_state"] == {"samples_seen": 8, "rank_tensor": [0, 1, 2]}


def test_resume_at_another_world_size_is_within_1e5(world1):
    reference, resumed = world1["reference"], world1["resumed"]
    assert resumed["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert resumed["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5)
    assert resumed["lr"] == reference["lr"]
    assert world1["max_rel_weight_diff"] <= 1e-5
    assert world1["report"]["rng"] == "reseeded (layout changed)"
    assert world1["report"]["num_updates"] == 2
    assert world1["extra_state"] == {"samples_seen": 8}  # counters carry over; rank tensors do not


def test_save_reports_the_bytes_each_rank_wrote(world2):
    assert world2["saved"]["rank"] == 0 and world2["saved"]["bytes_written"] > 0


def test_hf_export_is_the_models_own_save_pretrained_layout(world2):
    export = world2["export"]
    assert export["class"] == "LlamaForCausalLM"
    assert export["keys_equal"] and export["weights_equal"]
    assert "model.safetensors" in export["files"] and "tokenizer.json" in export["files"]
    assert not export["partial_left"]
    assert world2["tied_export"] == {"lm_head_stored": False, "tied": True}  # a tied head stored once


def test_convert_exports_the_saved_checkpoint_with_the_saved_weights(world2):
    assert world2["convert"] == {"keys_equal": True, "weights_equal": True}


@pytest.mark.parametrize(
    "case, message",
    [
        ("truncated", "is truncated or altered"),
        ("corrupt", "is corrupt: CRC-32"),
        ("incomplete", "has no manifest.json: the save never completed"),
        ("other_model", "was saved from a model with hidden_size 4096"),
        (
            "megatron",
            "this role's checkpoint was written by the megatron backend; set actor.backend=megatron",
        ),
    ],
)
def test_a_damaged_or_foreign_checkpoint_is_refused_before_anything_changes(world2, case, message):
    result = world2["damaged"][case]
    assert all(e is not None and message in e for e in result["errors"]), result["errors"]
    assert result["errors"][0] == result["errors"][1]  # every rank says the same
    assert result["unchanged"]
