"""Megatron's optimizer (DP2, distributed optimizer on/off, LR schedule, clipping, bf16) and offloading
the training state (params, grads, optimizer) to host memory and to disk — one rank program, in the 2-rank
launch shared with other modules (tests/multiproc/conftest.py)."""

import math

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

SHARED_PART_2 = (
    "train_state",
    "tests.multiproc.train_state_checks",
    lambda request: [request.getfixturevalue("tmp_path_factory").mktemp("offload")],
)


@pytest.fixture(scope="module")
def checks(shared_launch_2):
    return {r["check"]: r for r in shared_result(shared_launch_2, "train_state")}


@pytest.fixture(scope="module")
def adam(checks):
    return checks["adam_matches_reference_with_and_without_distributed_optimizer"]


def hand_lr(step: int, lr: float, min_lr: float, warmup: int, total: int, style: str) -> float:
    if step <= warmup:
        return lr * step / warmup
    if style == "constant" or step > total:
        return lr if style == "constant" else min_lr
    ratio = (step - warmup) / (total - warmup)
    coeff = {"linear": 1 - ratio, "cosine": 0.5 * (1 + math.cos(math.pi * ratio))}[style]
    return min_lr + coeff * (lr - min_lr)


# --- optimizer ------------------------------------------------------------------------------------


def test_distributed_optimizer_on_and_off_give_the_same_parameters(adam):
    assert adam["max_param_change"] > 1e-3, "the steps barely moved the parameters"
    assert adam["dist_opt_vs_plain_max_param_diff"] <= 1e-6
    assert adam["losses"]["True"] == pytest.approx(adam["losses"]["False"], rel=1e-5)


def test_adam_steps_match_torch_adamw_on_the_whole_batch(adam):
    assert adam["plain_vs_reference_max_param_diff"] <= 1e-6
    assert adam["dist_opt_vs_reference_max_param_diff"] <= 1e-6
    for flag in ("False", "True"):
        assert adam["grad_norms"][flag] == pytest.approx(adam["reference_grad_norms"], rel=1e-5)
        assert adam["losses"][flag] == pytest.approx(adam["reference_losses"], abs=1e-5)


def test_lr_warms_up_then_decays_by_cosine(adam):
    # train_state_checks.SCHEDULE: lr 1e-3 to min_lr 1e-4, 2 warm-up updates, 5 updates in all
    expected = [hand_lr(k, 1e-3, 1e-4, 2, 5, "cosine") for k in range(5)]
    assert expected[:3] == [0.0, 5e-4, 1e-3]
    for flag in ("False", "True"):
        assert adam["lrs"][flag] == pytest.approx(expected, abs=1e-15)


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_lr_schedule_is_exact_and_holds_min_lr_after_total_steps(checks, style):
    result = checks["lr_schedules"][style]
    expected = [hand_lr(k, 1.0, 0.1, 2, 6, style) for k in range(8)]
    assert result["lrs"] == pytest.approx(expected, abs=1e-12)
    assert result["num_updates"] == 8
    assert result["weight_decays"] == [0.0, 0.05]  # biases and norms decay-free


def test_grad_clipping_clips_the_global_norm_to_clip_grad(adam):
    clip = adam["clip"]
    for flag in ("False", "True"):
        assert min(adam["grad_norms"][flag]) > 2 * clip, "clipping was not active"
        assert adam["clipped_norms"][flag] == pytest.approx([clip] * 5, rel=1e-5)


@pytest.mark.parametrize("dist_opt", ["False", "True"])
def test_grad_norm_is_reported_without_clipping(checks, adam, dist_opt):
    norm = checks["grad_norm_without_clipping"]["grad_norms"][dist_opt]
    assert norm == pytest.approx(adam["reference_grad_norms"][0], rel=1e-5)


def test_zeros_in_the_gradient_are_counted_on_request(checks):
    result = checks["grad_norm_without_clipping"]
    # At least the padded vocabulary rows (300 -> 384) of the embedding and output layer (hidden 64).
    assert result["num_zeros"] == result["zeros_in_main_grad"] >= 2 * (384 - 300) * 64


def test_wrap_and_optimizer_must_agree_on_the_distributed_optimizer(checks):
    assert "pass the same value to wrap_ddp" in checks["lr_schedules"]["mismatch_error"]


@pytest.mark.parametrize("dist_opt", [False, True])
def test_bf16_params_keep_fp32_main_params_and_track_fp32_loss(checks, dist_opt):
    result = checks["bf16_mixed_precision"]
    run = result[f"dist_opt_{dist_opt}"]
    assert run["param_dtypes"] == ["torch.bfloat16"]
    assert run["main_param_dtypes"] == ["torch.float32"]
    shards = 2 if dist_opt else 1
    assert run["param_numel"] / shards <= run["main_param_numel"] <= run["param_numel"] / shards * 1.01
    diffs = [abs(a - b) for a, b in zip(run["losses"], result["fp32_losses"])]
    assert 0 < max(diffs) <= 5e-3 * result["fp32_losses"][0], diffs
    if not dist_opt:
        assert run["params_equal_rounded_main_params"]
        assert run["main_differs_from_rounded"]


def test_skipped_fp16_updates_do_not_advance_the_lr_schedule(checks):
    fp16 = checks["bf16_mixed_precision"]["fp16"]
    assert [s["update_successful"] for s in fp16["steps"]] == [False] * 3
    # With warm-up the lr would have been 0, 5e-4, 1e-3 had the schedule advanced.
    assert [s["lr"] for s in fp16["steps"]] == [0.0] * 3
    assert fp16["num_updates"] == 0 and fp16["params_unchanged"]
    assert all(math.isnan(s["grad_norm"]) for s in fp16["steps"])


# --- offload ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def round_trip(checks):
    return checks["offload_round_trip_and_training_continues"]


@pytest.mark.parametrize("target", ["host", "disk"])
def test_offload_empties_and_reload_restores_bit_exact(round_trip, target):
    result = round_trip["targets"][target]
    assert result["emptied"] == {"params": True, "grads": True, "optimizer": True}
    assert result["bit_exact"] == {"params": True, "grads": True, "optimizer": True}
    param_bytes = round_trip["param_bytes"]
    for state in ("params", "grads", "optimizer"):
        offloaded, reloaded = result["offload"][state], result["reload"][state]
        # Sharded Adam moments (2 x 4 bytes x N/2) weigh as much as the fp32 params; DDP pads a little.
        assert param_bytes <= offloaded["bytes"] <= param_bytes * 1.01
        assert reloaded["bytes"] == offloaded["bytes"]
    assert result["offload"]["params"]["storages"] == 1  # DDP's contiguous buffer


def test_disk_offload_frees_the_bytes_it_claims(round_trip):
    result = round_trip["targets"]["disk"]
    for state in ("params", "grads", "optimizer"):
        offloaded, reloaded = result["offload"][state], result["reload"][state]
        assert offloaded["freed"] >= 0.8 * offloaded["bytes"], (state, offloaded)
        assert -reloaded["freed"] >= 0.8 * reloaded["bytes"], (state, reloaded)


def test_host_offload_frees_nothing_overall_on_cpu(round_trip):
    # On CPU the compute device is host memory: the bytes change place, RSS stays.
    for state, offloaded in round_trip["targets"]["host"]["offload"].items():
        assert abs(offloaded["freed"]) <= 0.2 * offloaded["bytes"], (state, offloaded)


def test_training_after_offload_equals_training_without(round_trip):
    assert round_trip["params_equal_after_steps"]
    losses, norms = round_trip["losses_after_reload"], round_trip["grad_norms_after_reload"]
    assert losses[0] == losses[1] and norms[0] == norms[1]


@pytest.mark.parametrize(
    "case, bytes_per_param",
    [
        ("fp32_dist_opt_False", 8),
        ("fp32_dist_opt_True", 8),
        ("bf16_dist_opt_False", 12),
        ("bf16_dist_opt_True", 12),
    ],
)
def test_optimizer_offload_moves_only_the_optimizers_own_state(checks, case, bytes_per_param):
    """Adam moments (8 bytes/param) plus fp32 main params when the model is bf16 (4 more), plus a
    4-byte step counter per tensor; with the distributed optimizer each rank holds about half."""
    run = checks["optimizer_offload_moves_only_optimizer_storages"][case]
    assert run["params_kept"] and run["bit_exact"]
    if case.endswith("False"):
        assert run["bytes"] == bytes_per_param * run["param_numel"] + 4 * run["param_tensors"]
    else:
        half = bytes_per_param * run["param_numel"] / 2
        assert half <= run["bytes"] <= half * 1.01 + 4 * run["param_tensors"]


def test_frozen_reference_offloads_to_disk_without_ddp(checks):
    result = checks["offload_frozen_reference"]
    assert result["emptied"] and result["logits_equal"]
    assert result["offload"]["bytes"] == result["param_bytes"]
    assert result["offload"]["storages"] > 1  # one per parameter: no DDP buffer here
    assert result["offload"]["freed"] >= 0.8 * result["param_bytes"]


@pytest.mark.parametrize("dist_opt", ["False", "True"])
def test_a_nan_loss_on_one_rank_skips_the_update_everywhere(checks, dist_opt):
    r = checks["nonfinite_update_is_skipped"][dist_opt]
    assert r["decisions"] == [[False, True], [False, True]]  # both ranks: not applied, non-finite
    assert not r["grad_norm_finite"]
    assert r["params_unchanged"] and r["optimizer_state_unchanged"]
    assert r["updates_unchanged"] and r["lr_unchanged"]  # the LR schedule did not advance


@pytest.mark.parametrize("dist_opt", ["False", "True"])
def test_the_step_after_a_skipped_one_is_as_if_it_never_happened(checks, dist_opt):
    r = checks["nonfinite_update_is_skipped"][dist_opt]
    assert r["next_step_successful"] and not r["next_step_nonfinite"]
    assert r["updates_after"] == [2, 2]
    assert r["max_param_diff_vs_no_nan_run"] <= 1e-7
