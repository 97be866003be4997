"""reward.function / reward.weights / reward.overlong_buffer and the data flags: loading and checks."""

from __future__ import annotations

import pytest

from megarl.config import ConfigError, config_to_yaml, load_config

pytestmark = pytest.mark.unit


def problems(overrides: list[str], check_paths: bool = False) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, check_paths=check_paths)
    return info.value.problems


def test_weights_mapping_from_yaml_and_per_entry_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("reward:\n  weights: {function: 1.0, rm: 0.5}\n  model_path: /rm\n")
    cfg = load_config(path, ["reward.weights.rm=0.25", "reward.weights.bonus=2"], check_paths=False)
    assert cfg.reward.weights == {"function": 1.0, "rm": 0.25, "bonus": 2.0}
    again = tmp_path / "again.yaml"
    again.write_text(config_to_yaml(cfg))
    assert load_config(again, check_paths=False).reward.weights == cfg.reward.weights


def test_badly_typed_weights_name_the_key():
    assert problems(["reward.weights.rm=abc"]) == [
        "reward.weights.rm=abc is invalid: expected a number; e.g. reward.weights.rm=1.0"
    ]
    assert problems(["reward.weights=3"]) == [
        "reward.weights=3 is invalid: expected a mapping (each value a number); e.g. reward.weights={}"
    ]


def test_reward_and_data_fields_default_like_verl():
    cfg = load_config(None, [], check_paths=False)
    assert (cfg.reward.function.path, cfg.reward.function.name) == (None, "compute_score")
    assert cfg.reward.weights == {} and not cfg.reward.overlong_buffer.enable
    assert cfg.data.apply_chat_template and cfg.data.filter_overlong_prompts


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["reward.function.path=rewards.txt"], "reward.function.path=rewards.txt is not a .py file"),
        (["reward.function.path=x.py", "reward.function.name=''"], "reward.function.name is empty"),
        (
            ["reward.weights.function=-1"],
            "reward.weights.function=-1.0 must be a number ≥ 0; use 0 to switch",
        ),
        (["reward.weights.rm=1"], "reward.weights.rm=1.0 but the reward model is off"),
        (
            ["reward.overlong_buffer.enable=true", "data.max_response_length=64"],
            "reward.overlong_buffer.len=0 must be in [1, 64] (the response limit) when "
            "reward.overlong_buffer.enable=true; e.g. reward.overlong_buffer.len=16",
        ),
        (
            [
                "reward.overlong_buffer.enable=true",
                "reward.overlong_buffer.len=4",
                "reward.overlong_buffer.penalty_factor=-1",
            ],
            "reward.overlong_buffer.penalty_factor=-1.0 must be ≥ 0",
        ),
    ],
)
def test_reward_term_checks(overrides, expected):
    assert any(expected in p for p in problems(overrides)), problems(overrides)


def test_reward_file_must_exist_when_paths_are_checked(tmp_path):
    missing = tmp_path / "r.py"
    found = problems([f"reward.function.path={missing}"], check_paths=True)
    assert f"reward.function.path={missing} does not exist; fix the path or remove it" in found
    missing.write_text("def compute_score(*a, **k):\n    return 0.0\n")
    assert not any(
        "reward.function" in p for p in problems([f"reward.function.path={missing}"], check_paths=True)
    )
