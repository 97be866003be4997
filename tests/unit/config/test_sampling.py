"""Evaluation settings are checked like training's: rollout.val.* like rollout.*, and data.val_batch_size
(0 would have meant all of the files, a negative size no validation at all)."""

from __future__ import annotations

import pytest

from megarl.config import ConfigError, load_config

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.val.temperature=-1", "rollout.val.temperature=-1.0 must be ≥ 0; e.g. 1.0, or 0 for greedy"),
        ("rollout.val.top_p=0", "rollout.val.top_p=0.0 must be in (0, 1]; e.g. 1.0 to disable"),
        ("rollout.val.n=0", "rollout.val.n=0 must be ≥ 1; e.g. 1"),
        ("rollout.val.top_k=-5", "rollout.val.top_k=-5 must be ≥ -1; use -1 to disable"),
        (
            "rollout.val.n=4",  # greedy by default
            "rollout.val.temperature=0 (greedy) makes the rollout.val.n=4 samples of a prompt identical; set "
            "rollout.val.temperature > 0 (e.g. 1.0) or rollout.val.n=1",
        ),
        (
            "data.val_batch_size=0",
            "data.val_batch_size=0 must be ≥ 1; or null for all of data.val_files at once",
        ),
        (
            "data.val_batch_size=-3",
            "data.val_batch_size=-3 must be ≥ 1; or null for all of data.val_files at once",
        ),
    ],
)
def test_bad_evaluation_sampling_names_its_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override], check_paths=False)
    assert info.value.problems == [message]
