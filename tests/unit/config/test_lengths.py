"""The prompt limit plus the longest response must fit the model's positions (max_position_embeddings),
refused at load with both numbers and megarl's keys (vLLM would name VLLM_ALLOW_LONG_MAX_MODEL_LEN)."""

from __future__ import annotations

import pytest

from megarl.config import ConfigError, load_config
from tests.helpers.hf_configs import TINY_LLAMA, write_model_config
from tests.unit.config.test_load import QUICKSTART, SIZES

pytestmark = pytest.mark.unit

POSITIONS = TINY_LLAMA["max_position_embeddings"]  # 256; SIZES: prompt 64, response 32


@pytest.fixture
def run(tmp_path) -> list[str]:
    model = write_model_config(tmp_path / "tiny_llama", TINY_LLAMA)
    (tmp_path / "train.parquet").touch()
    return [
        *SIZES,
        f"model.path={model}",
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
    ]


def _problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, overrides)
    return info.value.problems


def test_prompt_plus_response_above_the_positions_names_both_numbers_and_keys(run):
    assert _problems([*run, "data.max_prompt_length=1000"]) == [
        "data.max_prompt_length + data.max_response_length = 1000 + 32 = 1032 tokens exceed the 256 positions "
        "of the model at model.path (max_position_embeddings in its config.json); lower them to sum to at most "
        "256, e.g. data.max_prompt_length=224"
    ]


def test_the_longest_rollout_response_counts(run):
    assert _problems([*run, "rollout.val.max_tokens=300"]) == [
        "data.max_prompt_length + rollout.val.max_tokens = 64 + 300 = 364 tokens exceed the 256 positions of "
        "the model at model.path (max_position_embeddings in its config.json); lower them to sum to at most "
        "256, e.g. data.max_prompt_length=128 and rollout.val.max_tokens=128"
    ]


def test_exactly_the_positions_load(run):
    cfg = load_config(QUICKSTART, [*run, f"data.max_prompt_length={POSITIONS - 32}"])
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == POSITIONS
    cfg = load_config(QUICKSTART, [*run, "rollout.max_tokens=16", "rollout.val.max_tokens=192"])
    assert cfg.rollout.val.max_tokens == 192  # 64 + 192 = 256


def test_a_critic_of_its_own_is_checked_too(run, tmp_path):
    short = write_model_config(tmp_path / "short_critic", {**TINY_LLAMA, "max_position_embeddings": 64})
    problems = _problems(
        [*run, "algorithm.name=ppo", "algorithm.adv_estimator=gae", f"critic.model_path={short}"]
    )
    assert problems == [
        "data.max_prompt_length + data.max_response_length = 64 + 32 = 96 tokens exceed the 64 positions of the "
        "model at critic.model_path (max_position_embeddings in its config.json); lower them to sum to at most "
        "64, e.g. data.max_prompt_length=32"
    ]


def test_a_linear_rope_scaling_multiplies_the_positions_and_yarn_does_not(run, tmp_path):
    linear = write_model_config(
        tmp_path / "linear", {**TINY_LLAMA, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    )
    cfg = load_config(QUICKSTART, [*run, f"model.path={linear}", "data.max_prompt_length=992"])
    assert cfg.data.max_prompt_length + cfg.data.max_response_length == 4 * POSITIONS
    yarn = write_model_config(
        tmp_path / "yarn", {**TINY_LLAMA, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    )
    assert (
        "exceed the 256 positions" in _problems([*run, f"model.path={yarn}", "data.max_prompt_length=992"])[0]
    )
