"""VLLMRollout (in-process vLLM, external-launcher mode) against transformers fp32 on a tiny Qwen2.

Two launches run every check (tests/multiproc/vllm_rollout_checks.py): `single`, a torchrun of one rank
with tp_g=1 (conftest's `vllm_single`, shared with test_partial_rollout), and `tp`, four ranks with
Megatron TP=2 and strided generation TP groups [0, 2], [1, 3], in the 4-rank launch shared with other
modules (tests/multiproc/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.multiproc.conftest import shared_result

pytestmark = pytest.mark.multiproc

LOG_PROB_TOL = 2e-5
N_PROMPTS, N_SAMPLES, RESPONSE, PROMPT = 4, 3, 10, 8


def _tp_argv(request) -> list:
    return [request.getfixturevalue("tiny_models")["qwen2"], request.getfixturevalue("perturbed_qwen2"), "tp"]


SHARED_PART = ("vllm_tp", "tests.multiproc.vllm_rollout_checks", _tp_argv)


@pytest.fixture(scope="module")
def single(vllm_single):
    return vllm_single


@pytest.fixture(scope="module")
def tp(shared_launch):
    return shared_result(shared_launch, "vllm_tp")


def test_returned_batch_has_the_rollout_schema(single):
    s = single["schema"]
    m = N_PROMPTS * N_SAMPLES
    assert s["rows"] == m
    assert s["shapes"] == {
        "prompts": [m, PROMPT],
        "responses": [m, RESPONSE],
        "input_ids": [m, PROMPT + RESPONSE],
        "attention_mask": [m, PROMPT + RESPONSE],
    }
    assert s["log_prob_dtype"] == "torch.float32"
    for fact in ("response_mask_is_prefix", "pad_after_response", "zero_log_prob_on_pad"):
        assert s[fact], fact
    for fact in ("input_ids_is_concat", "attention_mask_tail", "prompts_repeated"):
        assert s[fact], fact


def test_samples_of_a_prompt_are_adjacent_and_share_its_uid_and_columns(single):
    s = single["schema"]
    by_prompt = [i for i in range(N_PROMPTS) for _ in range(N_SAMPLES)]
    assert s["uid"] == by_prompt
    assert s["row"] == by_prompt
    assert s["tag"] == [f"prompt-{i}" for i in by_prompt]


def test_max_tokens_bounds_every_response(single):
    s = single["schema"]
    assert all(1 <= n <= RESPONSE for n in s["lengths"])
    assert set(s["finish_reason"]) <= {"stop", "length"}
    assert all(n == RESPONSE for n, r in zip(s["lengths"], s["finish_reason"]) if r == "length")
    assert single["t07_shape"] == [N_PROMPTS * 2, 6]  # n=2, max_tokens=6 from the SamplingConfig


def test_samples_of_a_prompt_differ(single):
    assert single["distinct_samples_per_prompt"] == [N_SAMPLES] * N_PROMPTS


@pytest.mark.parametrize("case", ["sampled", "t07", "greedy"])
def test_rollout_log_probs_match_transformers_fp32(single, case):
    # t07: temperature 0.7, compared with log_softmax(logits / 0.7): the sampled distribution
    assert single[f"{case}_log_prob_diff"] <= LOG_PROB_TOL


def test_generate_without_log_probs_drops_only_that_column(single):
    assert single["without_log_probs"] == {"same_tokens": True, "columns": ["rollout_log_probs"]}


def test_greedy_is_deterministic(single):
    assert single["greedy_repeatable"]


def test_seed_stream_is_reproducible(single):
    assert single["same_step_same_samples"]
    assert single["next_step_new_samples"]
    assert single["other_seed_new_samples"]


@pytest.mark.parametrize("kind", ["stop_token", "stop_string"])
def test_stop_ends_the_response_keeping_the_stop_tokens(single, kind):
    stop = single[kind]
    assert stop["response"] == stop["expected"]
    assert stop["finish_reason"] == "stop"


def test_engine_leaves_global_rng_and_thread_settings_alone(single):
    assert single["rng_untouched"]
    assert single["threads_settable"]


def test_load_weights_refuses_part_of_an_engine_layer(single):
    assert single["partial_layer_push_refused"] == {"q_alone": True, "weights_without_biases": True}


def test_load_weights_equals_an_engine_built_from_the_checkpoint(single):
    assert single["push_loader"] == "layers"  # one engine TP rank on CPU: straight into the layers
    assert single["push_changed_tokens"]
    assert single["pushed_log_prob_diff"] <= LOG_PROB_TOL
    assert single["rebuilt_equals_pushed_tokens"]
    assert single["rebuilt_vs_pushed_log_prob_diff"] <= 1e-6


def test_bucketed_push_of_the_original_weights_restores_the_original_outputs(single):
    restore = single["bucketed_restore"]
    assert restore["buckets"] == 5  # four decoder layers and the rest
    assert restore["loaders"] == ["layers"]
    assert restore["same_tokens"]
    assert restore["log_prob_diff"] <= 1e-6


def test_default_process_group_survives_engine_close(single):
    assert single["default_group_after_close"] == 1.0


def test_engine_runs_with_the_given_strided_tp_groups(tp):
    assert tp["engine_tp_ranks"] == [[0, 2], [1, 3], [0, 2], [1, 3]]


def test_tp2_greedy_tokens_equal_tp1(tp, single):
    assert tp["greedy_tokens_all_ranks_equal"]
    assert tp["greedy_tokens"] == single["greedy_tokens"]


def test_tp2_log_probs_match_transformers_fp32(tp):
    assert max(tp["log_prob_diff_per_replica"]) <= LOG_PROB_TOL


def test_ranks_of_a_replica_sample_the_same_tokens_and_replicas_differ(tp):
    by_rank = tp["sampled_tokens"]
    assert by_rank[0] == by_rank[2] and by_rank[1] == by_rank[3]
    assert by_rank[0] != by_rank[1]


def test_tp2_weight_push_matches_tp1_and_transformers(tp, single):
    assert tp["push_loader"] == "reload_weights"  # vLLM's loader takes each engine's TP shard
    assert tp["pushed_greedy_tokens"] == single["pushed_greedy_tokens"]
    assert max(tp["pushed_log_prob_diff_per_replica"]) <= LOG_PROB_TOL


def test_megatron_groups_work_after_engine_close(tp):
    assert tp["all_reduce_after_close"] == {"world": 4.0, "megatron_tp": 2.0, "megatron_dp": 2.0}
