"""Megatron policy, reference, critic and reward-model workers on 4 ranks against transformers fp32.

One rank program (tests/multiproc/policy_checks.py, in the 4-rank launch shared with other modules:
tests/multiproc/conftest.py) runs every layout and every batching variant; the tests read its report.
"""

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

LAYOUTS = ["tp1pp1", "tp2pp1", "tp1pp2", "tp2pp2"]
LOG_PROB_TOL = 2e-5


def _argv(request) -> list:
    policy, reward = request.getfixturevalue("tiny_models"), request.getfixturevalue("tiny_reward_models")
    return [policy["qwen2"], reward["llama"], "layouts,batching"]  # both parts: one program


SHARED_PART = ("policy", "tests.multiproc.policy_checks", _argv)


@pytest.fixture(scope="module")
def launch(shared_launch) -> dict:
    return shared_result(shared_launch, "policy")


@pytest.fixture(scope="module")
def checks(launch) -> dict:
    return {layout: launch[layout] for layout in LAYOUTS}


@pytest.fixture(scope="module")
def batching(launch) -> dict:
    return {k: v for k, v in launch.items() if k not in LAYOUTS}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_log_prob_and_entropy_match_transformers_fp32(checks, layout):
    assert checks[layout]["log_prob_max_abs_diff"] <= LOG_PROB_TOL
    assert checks[layout]["entropy_max_abs_diff"] <= LOG_PROB_TOL


@pytest.mark.parametrize("layout", LAYOUTS)
def test_colocated_reference_gives_the_same_log_probs_before_training(checks, layout):
    # the reference runs one sequence per micro-batch, the actor two: op order differs slightly
    assert checks[layout]["ref_equals_actor"] <= 1e-5
    assert checks[layout]["ref_future_done"]  # an SPMD async call has already run


@pytest.mark.parametrize("layout", LAYOUTS)
def test_actor_and_reference_groups_expose_only_their_roles_methods(checks, layout):
    assert checks[layout]["roles_scoped"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_live_export_writes_the_source_weights_in_one_shard_per_stage(checks, layout):
    assert checks[layout]["export_bit_exact"]
    pp = int(layout[-1])
    shards = (
        ["model.safetensors"]
        if pp == 1
        else [f"model-{i:05d}-of-{pp:05d}.safetensors" for i in range(1, pp + 1)]
    )
    index = ["model.safetensors.index.json"] if pp > 1 else []
    assert [f for f in checks[layout]["export_files"] if f.startswith("model")] == sorted(shards + index)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_first_update_loss_is_minus_the_token_mean_advantage(checks, layout):
    # old_log_probs = current log-probs, so every ratio is 1 and nothing is clipped.
    assert checks[layout]["pg_loss"] == pytest.approx(checks[layout]["hand_pg_loss"], abs=1e-5)


def test_update_gives_the_same_loss_and_grad_norm_for_every_layout(checks):
    base = checks["tp1pp1"]
    for layout in LAYOUTS[1:]:
        assert checks[layout]["pg_loss"] == pytest.approx(base["pg_loss"], abs=1e-5), layout
        assert checks[layout]["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5), layout
        assert checks[layout]["critic_grad_norm"] == pytest.approx(base["critic_grad_norm"], rel=1e-5), layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_update_lowers_the_surrogate_loss(checks, layout):
    assert checks[layout]["surrogate_after"] < checks[layout]["pg_loss"] - 1e-3


@pytest.mark.parametrize("layout", LAYOUTS)
def test_critic_values_match_transformers_and_value_loss_falls(checks, layout):
    assert checks[layout]["values_max_abs_diff"] <= LOG_PROB_TOL
    losses = checks[layout]["value_losses"]
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_megatron_reward_model_scores_the_last_token_like_transformers(checks, layout):
    assert checks[layout]["rm_score_max_abs_diff"] <= LOG_PROB_TOL


VARIANTS = ["mbs1", "packed", "packed_mask", "packed_sp", "balanced", "recompute", "sequence_parallel"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_micro_batching_does_not_change_log_probs_loss_or_gradients(checks, batching, variant):
    got, base = batching[variant], checks["tp2pp1"]
    expected = {"packed": "thd", "packed_sp": "thd", "packed_mask": "mask"}.get(variant, "pad")
    assert got["packed_as"] == expected
    assert got["log_prob_max_abs_diff"] <= LOG_PROB_TOL
    assert got["pg_loss"] == pytest.approx(base["pg_loss"], abs=1e-5)
    assert got["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5)


def test_fused_old_log_probs_give_the_recomputed_update_and_log_the_rollout_mismatch(checks, batching):
    got, base = batching["fused"], checks["tp2pp1"]
    assert got["pg_loss"] == pytest.approx(base["pg_loss"], abs=1e-5)
    assert got["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5)
    assert got["diff_mean"] == pytest.approx(got["expected_diff_mean"], rel=1e-4)
    assert got["diff_max"] == pytest.approx(got["expected_diff_max"], rel=1e-4)
    without = got["without_rollout"]  # rollout.calculate_log_probs=false: same update, no mismatch metric
    assert without["pg_loss"] == got["pg_loss"] and without["grad_norm"] == got["grad_norm"]
    assert without["metrics"] == []


def test_actor_reports_sum_pi_squared_and_trains_with_the_configured_loss_and_is_weights(batching):
    wiring = batching["loss_wiring"]
    assert wiring["sum_pi_squared_max_abs_diff"] <= LOG_PROB_TOL  # vocab-parallel vs transformers' softmax
    assert wiring["sapo_pg_loss"] == pytest.approx(wiring["sapo_expected"], abs=1e-5)


def test_dp_balancing_evens_out_tokens_per_rank(batching):
    tokens = batching["balanced"]["dp_tokens"]
    assert abs(tokens[0] - tokens[1]) <= 2, tokens


def test_offload_to_disk_blocks_compute_and_reloads_bit_exact(batching):
    # after one update the actor holds params, grads and Adam state
    off = batching["mbs1"]["offload"]
    assert set(off["offloaded"]) == {"params", "grads", "optimizer"}
    assert all(b > 0 for b in off["offloaded"].values())
    assert off["reloaded"] == off["offloaded"]
    assert "offloaded; call reload() first" in off["refused"]
    assert off["bit_exact"]


PREFERENCE_LOSSES = ["dpo", "ipo", "kto", "orpo", "simpo"]


@pytest.mark.parametrize("loss", PREFERENCE_LOSSES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_preference_update_loss_is_the_pure_functions_on_the_actors_log_probs(checks, layout, loss):
    got = checks[layout]["preference"][loss]
    assert got["loss"] == pytest.approx(got["expected_loss"], rel=1e-5, abs=1e-6)
    assert got["margin"] == pytest.approx(got["expected_margin"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("loss", PREFERENCE_LOSSES)
def test_preference_update_gives_the_same_loss_and_grad_norm_for_every_layout(checks, loss):
    base = checks["tp1pp1"]["preference"][loss]
    assert base["grad_norm"] > 0
    for layout in LAYOUTS[1:]:
        got = checks[layout]["preference"][loss]
        assert got["loss"] == pytest.approx(base["loss"], rel=1e-5), layout
        assert got["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5), layout


@pytest.mark.parametrize("loss", PREFERENCE_LOSSES)
def test_preference_micro_batches_of_whole_pairs_do_not_change_loss_or_gradients(batching, loss):
    # mbs1: one pair (two rows) per micro-batch; packed: pairs packed to a 40-token budget
    base = batching["recompute"]["preference"][loss]
    for variant in ("mbs1", "packed", "packed_mask", "packed_sp", "sequence_parallel"):
        got = batching[variant]["preference"][loss]
        assert got["loss"] == pytest.approx(base["loss"], rel=1e-5), variant
        assert got["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5), variant
