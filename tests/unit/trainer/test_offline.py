"""The offline trainers' (SFT, preference) batch size and the checkpoint job check, without workers."""

from __future__ import annotations

import pytest

from megarl.checkpoint.run import RL_JOB, ResumeError, check_job
from megarl.data.files import DataError
from megarl.trainer.offline import offline_batch_size


@pytest.mark.parametrize(
    ("train_batch_size", "n_rows", "dp", "expected"),
    [(32, 1024, 2, 32), (32, 30, 4, 28), (32, 3, 4, 0), (8, 7, 1, 7), (6, 31, 2, 6)],
)
def test_a_step_holds_a_multiple_of_the_dp_size_and_no_padded_rows(train_batch_size, n_rows, dp, expected):
    if expected == 0:
        with pytest.raises(DataError, match="3 usable row.*fewer than the actor's 4 data-parallel ranks"):
            offline_batch_size(train_batch_size, n_rows, dp)
    else:
        assert offline_batch_size(train_batch_size, n_rows, dp) == expected


def test_a_checkpoint_of_another_job_is_refused_with_the_way_out(tmp_path):
    check_job(tmp_path, {"job": "dpo"}, "dpo")
    check_job(tmp_path, {}, RL_JOB)  # the RL trainer's checkpoints before the field existed
    with pytest.raises(
        ResumeError, match="saved by megarl dpo, but this run is megarl kto.*trainer.output_dir"
    ):
        check_job(tmp_path, {"job": "dpo"}, "kto")
    with pytest.raises(ResumeError, match=r"saved by megarl train \(RL\), but this run is megarl sft"):
        check_job(tmp_path, {}, "sft")
