"""The actor's role checkpoint (weights, optimizer, LR schedule, RNG, counters) through the worker: the
save side, in the 4-rank launch shared with other modules (tests/multiproc/conftest.py), saves at TP2×PP2
and checks the same-layout resume and the bad-checkpoint errors; the load side, in the shared 2-rank launch,
loads the same checkpoints at TP1×PP2 and TP1×PP1 (DP2). A tiny Qwen3-MoE saved at EP2 (and TP2×EP2+SP)
resumes at EP1."""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

SHARED_PART = (
    "checkpoint",
    "tests.multiproc.checkpoint_checks:save_side",
    lambda request: request.getfixturevalue("checkpoint_spec"),
)


def _load_argv(request) -> list:
    request.getfixturevalue("shared_launch")  # the save side first: the load side reads its checkpoints
    return request.getfixturevalue("checkpoint_spec")


SHARED_PART_2 = ("checkpoint_load", "tests.multiproc.checkpoint_checks:load_side", _load_argv)


@pytest.fixture(scope="module")
def saved(shared_launch):
    return {r["check"]: r for r in shared_result(shared_launch, "checkpoint")}


@pytest.fixture(scope="module")
def resharded(shared_launch_2):
    return {r["check"]: r for r in shared_result(shared_launch_2, "checkpoint_load")}


ROLE_FILES = {
    "manifest.json",
    "megarl_checkpoint.json",
    "scheduler.json",
    "model/.metadata",
    "optimizer/.metadata",
}


@pytest.mark.parametrize("dist_opt", [False, True])
def test_same_layout_resume_continues_bit_exactly(saved, dist_opt):
    r = saved[f"same_layout_dist_opt_{dist_opt}"]
    assert r["losses_b"] == r["losses_a"]
    assert r["equal"] == {"params": True, "moments": True, "steps": True}
    assert r["report"]["optimizer"] == "loaded" and r["report"]["rng"] == "restored"
    assert r["report"]["num_updates"] == 2


@pytest.mark.parametrize("dist_opt", [False, True])
def test_every_parameter_keeps_its_own_adam_step(saved, dist_opt):
    r = saved[f"same_layout_dist_opt_{dist_opt}"]
    assert r["steps_distinct"]
    assert r["step_values"] == [4.0]  # 2 before the save + 2 after: one count per update, not per param


def test_rng_and_actor_counters_come_back(saved):
    r = saved["same_layout_dist_opt_True"]
    assert r["rng_restored"] and r["draws_equal"] and r["generator_restored"]
    assert r["sampling_step"] == 7


def test_role_dir_layout_and_meta(saved):
    r = saved["same_layout_dist_opt_True"]
    files = set(r["files"])
    assert ROLE_FILES <= files
    assert {f"rng/rank_{i}.{ext}" for i in range(4) for ext in ("json", "safetensors")} <= files
    assert any(f.startswith("hf/config.json") for f in files)
    assert not any(f.endswith((".pkl", ".pickle")) for f in files)
    meta = r["meta"]
    assert meta["world_size"] == 4 and meta["has_optimizer"] and meta["saved_layout"] == "tp2xpp2xdp1"
    assert meta["architecture"]["hidden_size"] == 128 and meta["architecture"]["head"] == "lm"
    assert r["saved"]["bytes_written"] > 0


@pytest.mark.parametrize(
    "case, words",
    [
        ("truncated", ["truncated/optimizer/__0_0.distcp", "truncated", "bytes", "manifest.json says"]),
        ("corrupt", ["corrupt/model/__0_0.distcp", "CRC-32", "same size"]),
        ("no_manifest", ["no manifest.json", "never completed"]),
        ("bad_json", ["bad_json/megarl_checkpoint.json is corrupt"]),
        ("never", ["never completed", "never.partial"]),
        ("missing", ["missing is not a megarl checkpoint"]),
        (
            "other_architecture",
            [
                "was saved from a model with hidden_size 128, num_hidden_layers 4",
                "has hidden_size 64",
                "model.path",
            ],
        ),
    ],
)
def test_bad_checkpoints_fail_on_every_rank_with_the_file_and_the_mismatch(saved, case, words):
    message = saved["bad_checkpoints"]["errors"][case]
    for word in words:
        assert word in message, message


def test_failed_loads_change_nothing_and_frozen_roles_cannot_save(saved):
    r = saved["bad_checkpoints"]
    assert r["params_unchanged_by_failed_loads"]
    assert "frozen" in r["frozen"]


@pytest.mark.parametrize("layout", ["tp1pp2", "tp1pp1"])
@pytest.mark.parametrize("dist_opt", [False, True])
def test_tp2pp2_checkpoint_reshards_model_and_optimizer(saved, resharded, layout, dist_opt):
    ref = saved[f"same_layout_dist_opt_{dist_opt}"]
    r = resharded[f"{layout}_dist_opt_{dist_opt}"]
    assert r["report"]["optimizer"] == "loaded" and r["num_updates"] == 2
    assert r["report"]["rng"] == "reseeded (layout changed)"
    assert r["step_loss"] == pytest.approx(ref["ref_step_loss"], rel=1e-5)
    # after one more update: wrong Adam moments or steps would show far above this tolerance
    assert r["loss"] == pytest.approx(ref["ref_loss"], rel=1e-5)
    assert r["sampling_step"] == 7 and not r["generator"]  # counters carry over, random states do not


@pytest.mark.parametrize("dist_opt", [False, True])
def test_moe_checkpoint_saved_at_ep2_resumes_at_ep1(saved, resharded, dist_opt):
    ref = saved[f"moe_dist_opt_{dist_opt}"]
    assert ref["saved_layout"] == ("tp2xpp1xdp2xep2xsp" if dist_opt else "tp1xpp1xdp4xep2")
    assert ref["same_layout"] == ref["ref"]  # loaded back at the saved layout: bit-exact
    r = resharded[f"moe_ep1_dist_opt_{dist_opt}"]
    assert r["optimizer"] == "loaded" and r["num_updates"] == 2
    # the uninterrupted run's next step (batch A) and, after it, the loss on batch B
    assert r["resumed"] == pytest.approx(ref["ref"], rel=1e-5)
