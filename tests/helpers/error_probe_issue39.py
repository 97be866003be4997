"""The 29 cases issue 39 names (fixed and tested there), in the error probe's form; the cheap ones run in
tests/unit/test_probe.py too, the others name the test that shows them."""

from __future__ import annotations

import json

from tests.helpers.error_probe import (
    Case,
    Workspace,
    convert_case,
    reward_file_case,
    trainer_state_case,
)


def _save_hf_over_model(ws: Workspace) -> list[str]:
    out = ws.case_dir / "run"
    model = ws.model_copy("m")
    (out).mkdir()
    model.rename(out / "hf")
    return ws.show(f"model.path={out / 'hf'}", "trainer.save_hf=true", f"trainer.output_dir={out}")


def _convert_over_run(ws: Workspace) -> list[str]:
    run = ws.checkpoint_run()
    return ["convert", "mcore-to-hf", "--ckpt", str(run), "--out", str(run), "--overwrite"]


def _convert_over_file(ws: Workspace) -> list[str]:
    return convert_case(ws, ws.checkpoint_run())[:-2] + ["--out", str(ws.file("export", "x")), "--overwrite"]


def _dir_named_parquet(ws: Workspace) -> list[str]:
    (ws.case_dir / "x.parquet").mkdir()
    return ws.show(f"data.train_files=[{ws.case_dir / 'x.parquet'}]")


def _state_step_four(ws: Workspace) -> list[str]:
    return trainer_state_case(ws, json.dumps({"version": 1, "step": "four", "job": "rl"}))


UNIT_TESTS = "tests/unit/"
ISSUE_CASES: list[Case] = [
    Case(
        "I01",
        "concurrency",
        "two runs in one output_dir",
        None,
        (),
        2,
        UNIT_TESTS
        + "trainer/test_run_lock.py::test_megarl_train_in_a_directory_in_use_is_refused_within_seconds",
        "megarl train: error: trainer.output_dir=/x/run is in use by another megarl run: pid 123 on host h, running since 2026-12-06 14:00:00 UTC; lock file /x/run/run.lock. Wait for that run to finish (or stop it), or give this run another trainer.output_dir",
    ),
    Case(
        "I02",
        "outputs",
        "trainer.save_hf=true with model.path = <output_dir>/hf",
        _save_hf_over_model,
        (
            "trainer.save_hf=true writes the Hugging Face model to <case>/run/hf, which is model.path=<case>/run/hf: the export would overwrite the model it starts from",
        ),
        2,
        UNIT_TESTS + "config/test_outputs.py::test_save_hf_over_the_starting_model_is_refused_at_load",
    ),
    Case(
        "I03",
        "conversion",
        "`convert mcore-to-hf --ckpt RUN --out RUN --overwrite`",
        _convert_over_run,
        (
            "--out <case>/run contains the checkpoint --ckpt names (<case>/run/checkpoints/step_2/actor): writing it would overwrite its own input",
        ),
        2,
        UNIT_TESTS + "test_cli.py::test_mcore_to_hf_over_its_own_run_is_refused_and_the_run_kept",
    ),
    Case(
        "I04",
        "signals",
        "SIGKILL / SIGTERM of `megarl train … trainer.launcher=torchrun`",
        None,
        (),
        75,
        "tests/e2e/test_resume.py::test_torchrun_supervisor_sigkilled_rank_killed_then_sigterm_mid_step_saves_it",
        "megarl train: stopped by SIGTERM after step 2: checkpoint <out>/checkpoints/step_2 saved; rerun the same command to resume from it (exit code 75)",
    ),
    Case(
        "I05",
        "concurrency",
        "a second run joining the first's Ray cluster",
        None,
        (),
        2,
        "tests/e2e/test_resume.py::test_two_ray_runs_at_once_each_on_its_own_loopback_cluster_one_sigtermed_then_resumed",
        "each run starts its own loopback cluster; RAY_ADDRESS that does not answer: `RAY_ADDRESS=127.0.0.1:1234 does not answer (nothing listens on 127.0.0.1:1234); start that cluster, or unset RAY_ADDRESS to run on a private one`",
    ),
    Case(
        "I06",
        "resume",
        "resume on another data set of the same size",
        None,
        (),
        2,
        UNIT_TESTS
        + "trainer/test_resume_checks.py::test_resume_on_other_data_of_the_same_size_names_both_files",
        "/r/checkpoints/step_2 was trained on other data: data.train_files = /d/other.jsonl (123 bytes, sha256 1a2b…); the checkpoint's were /d/train.jsonl (…). Resume with the files it was trained on, or start afresh with trainer.resume=disable (or another trainer.output_dir)",
    ),
    Case(
        "I07",
        "data",
        "rows without a ground truth",
        None,
        (),
        0,
        UNIT_TESTS
        + "data/test_datasets.py::test_rows_without_a_ground_truth_are_reported_when_the_rewards_need_one",
        "data.train_files: skipped 2 malformed of 3 rows: no ground truth (reward_model.ground_truth), which the rule rewards compare with (2: train.parquet row 1, train.parquet row 2)",
    ),
    Case(
        "I08",
        "conversion",
        "convert to a read-only --out",
        None,
        (),
        2,
        UNIT_TESTS + "checkpoint/test_output_safety.py::test_a_read_only_output_is_blamed_not_the_checkpoint",
        "/ro/hf cannot be written (Read-only file system); choose a location you can write to",
    ),
    Case(
        "I09",
        "signals",
        "SIGTERM of the Ray driver",
        None,
        (),
        75,
        "tests/e2e/test_resume.py::test_two_ray_runs_at_once_each_on_its_own_loopback_cluster_one_sigtermed_then_resumed",
        "megarl train: stopped by SIGTERM after step N: checkpoint …/step_N saved; rerun the same command to resume from it (exit code 75)",
    ),
    Case(
        "I10",
        "reward",
        "a reward function that never returns",
        None,
        (),
        0,
        UNIT_TESTS
        + "rewards/test_containment.py::test_every_failure_fails_its_row_only_and_lost_workers_are_replaced",
        "the row fails `timed out after 10s` (reward.timeout_s), counted in reward/errors",
    ),
    Case(
        "I11",
        "reward",
        "countdown answer `99**98**97`",
        None,
        (),
        0,
        UNIT_TESTS + "rewards/test_rules.py::test_countdown_never_evaluates_powers_or_unbounded_answers",
        "scores as a wrong equation (0.1) in < 0.1 s",
    ),
    Case(
        "I12",
        "config",
        "`actor.optimizer.lr=nan`",
        lambda ws: ws.show("actor.optimizer.lr=nan"),
        ("actor.optimizer.lr=nan is not a finite number; set a finite value, e.g. actor.optimizer.lr=",),
        2,
        UNIT_TESTS + "config/test_field_checks.py::test_every_float_key_set_to_nan_or_inf_is_named_alone",
    ),
    Case(
        "I13",
        "config",
        "`rollout.temperature=inf`",
        lambda ws: ws.show("rollout.temperature=inf"),
        ("rollout.temperature=inf is not a finite number; set a finite value, e.g. rollout.temperature=1.0",),
        2,
        UNIT_TESTS + "config/test_field_checks.py::test_every_float_key_set_to_nan_or_inf_is_named_alone",
    ),
    Case(
        "I14",
        "config",
        "max_prompt_length above the model's positions",
        lambda ws: ws.show("data.max_prompt_length=1000"),
        (
            "data.max_prompt_length + data.max_response_length = 1000 + 8 = 1008 tokens exceed the 512 positions of the model at model.path",
        ),
        2,
        UNIT_TESTS
        + "config/test_lengths.py::test_prompt_plus_response_above_the_positions_names_both_numbers_and_keys",
    ),
    Case(
        "I15",
        "layout",
        "64 ranks on a 2-CPU machine",
        None,
        (),
        2,
        UNIT_TESTS + "config/test_machine.py::test_64_ranks_on_2_cpus_name_the_keys_to_change",
        "trainer.n_devices_per_node=64 asks for 64 ranks on this machine, which has no GPU and 2 CPU cores, so at most 16 CPU processes (2 per core, at least 16); set trainer.n_devices_per_node=16 or less (…), or run on a cluster (trainer.nnodes > 1, or a Ray cluster named by RAY_ADDRESS)",
    ),
    Case(
        "I16",
        "resume",
        "'rerun to resume' where nothing was saved",
        None,
        (),
        1,
        UNIT_TESTS
        + "checkpoint/test_resume_advice.py::test_no_checkpoint_yet_says_the_rerun_starts_from_step_0",
        "no checkpoint was saved under RUN/checkpoints, so rerunning starts from step 0 (trainer.save_every=N saves every N steps)",
    ),
    Case(
        "I17",
        "config",
        "`algorithm.kl_loss_coef=nan`",
        lambda ws: ws.show("algorithm.kl_loss_coef=nan"),
        (
            "algorithm.kl_loss_coef=nan is not a finite number; set a finite value, e.g. algorithm.kl_loss_coef=0.001",
        ),
        2,
        UNIT_TESTS + "config/test_field_checks.py::test_every_float_key_set_to_nan_or_inf_is_named_alone",
    ),
    Case(
        "I18",
        "data",
        "a directory named `x.parquet`",
        _dir_named_parquet,
        (
            "data.train_files[0]=<case>/x.parquet is a directory, not a data file, and holds no .parquet, .jsonl or .json file; name a data file",
        ),
        2,
        UNIT_TESTS
        + "config/test_data_files.py::test_a_directory_named_like_a_parquet_file_is_not_reported_missing",
    ),
    Case(
        "I19",
        "data",
        "one 20 MB prompt",
        None,
        (),
        0,
        UNIT_TESTS
        + "data/test_lengths.py::test_prompts_far_beyond_the_bound_are_dropped_untokenised_and_counted_per_file",
        "data.train_files: dropped 1 prompt longer than data.max_prompt_length=64 tokens (1 over 1536 characters, not tokenised) in with_big.parquet: 1 (row 64); raise data.max_prompt_length to keep them",
    ),
    Case(
        "I20",
        "reward",
        "`sys.exit(3)` in a reward file at import",
        lambda ws: reward_file_case(ws, "import sys\nsys.exit(3)\n"),
        (
            "reward.function.path=<case>/my_reward.py called sys.exit(3) while being imported; a reward file must only define functions at import",
        ),
        2,
        UNIT_TESTS + "rewards/test_computer.py::test_loading_a_reward_file_reports_what_is_wrong",
    ),
    Case(
        "I21",
        "reward",
        "`compute_score = 5` in a reward file",
        lambda ws: reward_file_case(ws, "compute_score = 5\n"),
        ("has no reward function 'compute_score': it defines compute_score as int, not a function",),
        2,
        UNIT_TESTS + "rewards/test_computer.py::test_loading_a_reward_file_reports_what_is_wrong",
    ),
    Case(
        "I22",
        "reward",
        "a reward returning None/str/NaN on every row",
        None,
        (),
        1,
        UNIT_TESTS
        + "rewards/test_containment.py::test_the_computer_counts_failed_rows_and_stops_past_max_error_fraction",
        "reward function compute_score from /x/my_reward.py failed on 3 of 4 rows of this step (reward.max_error_fraction=0.5 allows 2); the first, batch row 1, …: TypeError: … Fix the function (its first failure is logged above with the traceback), or raise reward.max_error_fraction …",
    ),
    Case(
        "I23",
        "disk",
        "disk full mid-save",
        None,
        (),
        1,
        UNIT_TESTS
        + "checkpoint/test_run.py::test_a_full_disk_mid_save_is_one_message_and_the_previous_checkpoint_stays_latest",
        "megarl train: saving checkpoint step_4 failed: no space left on the device of /r/checkpoints (a checkpoint takes about 1.2 GB, 3.0 MB free); the unfinished save was removed and the previous checkpoint step_2 is intact and `latest` still names it. Free some space (trainer.max_checkpoints keeps fewer checkpoints) or move trainer.output_dir to a larger disk, then rerun to resume",
    ),
    Case(
        "I24",
        "resume",
        "total_steps below the checkpoint's step",
        None,
        (),
        0,
        UNIT_TESTS
        + "trainer/test_resume_checks.py::test_a_run_already_at_its_last_step_says_there_is_nothing_left",
        "megarl: /r/checkpoints/step_8 is at step 8 and this run ends at step 5 (trainer.total_steps or its epochs): nothing left to train. Raise trainer.total_steps to train further, or start afresh with trainer.resume=disable",
    ),
    Case(
        "I25",
        "resume",
        'trainer_state.json with `"step": "four"`',
        _state_step_four,
        ("trainer_state.json: field 'step' is \"four\", not a whole number ≥ 0; the file is damaged",),
        2,
        UNIT_TESTS + "checkpoint/test_run.py::test_a_damaged_trainer_state_names_the_file_and_the_field",
    ),
    Case(
        "I26",
        "conversion",
        "`convert --out <existing file> --overwrite`",
        _convert_over_file,
        (
            "--out <case>/export is a file, not a directory; --overwrite replaces an earlier export or conversion only",
        ),
        2,
        UNIT_TESTS
        + "checkpoint/test_output_safety.py::test_overwrite_of_a_file_is_refused_and_leaves_no_partial",
    ),
    Case(
        "I27",
        "checkpoint",
        "a truncated shard in a checkpoint without a manifest",
        None,
        (),
        2,
        UNIT_TESTS
        + "checkpoint/test_output_safety.py::test_a_truncated_shard_without_a_manifest_is_named_and_leaves_no_partial",
        "/c is damaged: /c/model/__0_0.distcp is truncated: N bytes, its records need M; export an earlier checkpoint or convert again",
    ),
    Case(
        "I28",
        "security",
        "Ray listening on every interface",
        None,
        (),
        0,
        "tests/ray/test_worker_group.py::test_the_session_cluster_is_named_and_listens_on_loopback_only",
        "every Ray listener of a private cluster on 127.0.0.1",
    ),
    Case(
        "I29",
        "security",
        "metrics endpoints answering without the token",
        None,
        (),
        0,
        "tests/ray/test_worker_group.py::test_the_session_cluster_is_named_and_listens_on_loopback_only",
        "dashboard and Ray's metrics exporter off",
    ),
]
