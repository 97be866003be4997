"""Bad input to `megarl train` / `megarl sft` is reported before any worker process starts (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from megarl.cli.job import run
from tests.helpers.data import verl_row, write_parquet

CONFIG = str(Path(__file__).resolve().parents[3] / "configs" / "quickstart_grpo.yaml")


@pytest.fixture
def overrides(tiny_models, tmp_path) -> list[str]:
    rows = [verl_row(f"reverse {d}", d[::-1], data_source="megarl/digits_reverse") for d in ("123", "4567")]
    data = write_parquet(tmp_path / "train.parquet", rows)
    return [
        f"model.path={tiny_models['llama']}",
        f"data.train_files=[{data}]",
        "data.val_files=[]",
        "trainer.eval_every=0",
        "data.train_batch_size=2",
        "algorithm.ppo_mini_batch_size=2",
        "actor.micro_batch_size=8",
        "ref.micro_batch_size=8",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]


def _fails(capsys, overrides: list[str], *expected: str) -> str:
    assert run(CONFIG, overrides) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err, err
    out = next(Path(o.split("=", 1)[1]) for o in overrides if o.startswith("trainer.output_dir="))
    assert not (out / "run.lock").exists()  # a run that failed released its output directory
    return err


def test_a_missing_data_file_names_the_key_and_the_path(capsys, overrides, tmp_path):
    missing = tmp_path / "nope.parquet"
    _fails(
        capsys, [*overrides, f"data.train_files=[{missing}]"], f"data.train_files[0]={missing} does not exist"
    )


def test_all_prompts_too_long_says_by_how_much(capsys, overrides):
    _fails(
        capsys,
        [*overrides, "data.max_prompt_length=4"],
        "no usable prompt",
        "longer than data.max_prompt_length=4 tokens",
        "raise data.max_prompt_length to at least",
    )


def test_an_unknown_data_source_without_a_reward_function(capsys, overrides, tmp_path):
    data = write_parquet(
        tmp_path / "private.parquet", [verl_row("reverse 12", "21", data_source="my/private")] * 2
    )
    _fails(
        capsys,
        [*overrides, f"data.train_files=[{data}]"],
        "no reward for data_source 'my/private'",
        "set reward.function.path=/path/to/reward.py",
    )


def test_rows_without_a_prompt_are_reported_and_the_rest_used(capsys, overrides, tmp_path):
    from transformers import AutoTokenizer

    from megarl.config import load_config
    from megarl.data.datasets import PromptDataset

    good = verl_row("reverse 12", "21", data_source="megarl/digits_reverse")
    data = write_parquet(tmp_path / "mixed.parquet", [good, {**good, "prompt": None}, good])
    cfg = load_config(CONFIG, [*overrides, f"data.train_files=[{data}]"])
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    dataset = PromptDataset.from_config(cfg.data, tokenizer, split="train")
    assert len(dataset) == 2 and "mixed.parquet row 1" in str(dataset.report.malformed)


PREFERENCE_CONFIG = str(Path(CONFIG).parent / "quickstart_preference.yaml")


@pytest.mark.parametrize("job", ["dpo", "kto", "rm"])
def test_preference_data_in_the_wrong_format_names_the_file_row_and_columns(
    capsys, caplog, tiny_models, tmp_path, job
):
    data = write_parquet(tmp_path / "sft.parquet", [{"prompt": "reverse 12", "response": "21"}] * 2)
    overrides = [
        f"model.path={tiny_models['llama']}",
        f"data.train_files=[{data}]",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    assert run(PREFERENCE_CONFIG, overrides, job=job) == 2
    captured = capsys.readouterr()
    assert f"megarl {job}: error: data.train_files: no usable" in captured.err, captured.err
    columns = "`completion` and `label`" if job == "kto" else "`chosen` and `rejected`"
    assert "sft.parquet row 0" in caplog.text and columns in caplog.text + captured.err, caplog.text


def test_megarl_train_on_a_preference_config_points_to_the_right_command(capsys, tiny_models, tmp_path):
    data = write_parquet(
        tmp_path / "pairs.parquet", [{"prompt": "reverse 12", "chosen": "21", "rejected": "12"}]
    )
    overrides = [f"model.path={tiny_models['llama']}", f"data.train_files=[{data}]"]
    assert run(PREFERENCE_CONFIG, overrides, job="train") == 2
    assert "algorithm.name=dpo is not RL training; run `megarl dpo" in capsys.readouterr().err


def test_megarl_sft_with_verl_keys_names_the_missing_nested_column(capsys, caplog, tiny_models, tmp_path):
    """verl's GSM8K RL parquet without extra_info.answer (an RL-only file) under verl's SFT keys: exit 2
    before any process starts, naming the file, the row, the column and the keys that are there."""
    rows = [verl_row(f"reverse {d}", d[::-1], data_source="megarl/digits_reverse") for d in ("12", "345")]
    data = write_parquet(tmp_path / "gsm8k.parquet", rows)
    overrides = [
        f"model.path={tiny_models['llama']}",
        f"data.train_files=[{data}]",
        "data.prompt_key=extra_info",
        "data.prompt_dict_keys=[question]",
        "data.response_key=extra_info",
        "data.response_dict_keys=[answer]",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]
    sft_config = str(Path(CONFIG).parent / "quickstart_sft.yaml")
    assert run(sft_config, overrides, job="sft") == 2
    err = capsys.readouterr().err
    assert "megarl sft: error: data.train_files: no usable SFT rows in" in err, err
    assert (
        "gsm8k.parquet row 0: column extra_info has no key 'question' (data.prompt_key=extra_info); its keys: "
        "split, index" in err
    ), err
    assert "Rows need the prompt at extra_info.question and the response at extra_info.answer" in err, err


@pytest.mark.parametrize("launcher", ["ray", "torchrun"])
def test_verls_gsm8k_scorer_as_reward_function_stops_before_ray_or_torchrun(
    capsys, overrides, tmp_path, launcher
):
    scorer = tmp_path / "gsm8k.py"  # verl's verl/utils/reward_score/gsm8k.py signature: no data_source
    scorer.write_text(
        "def compute_score(solution_str, ground_truth, method='strict', format_score=0.0, score=1.0):\n"
        "    return 0.0\n"
    )
    _fails(
        capsys,
        [*overrides, f"reward.function.path={scorer}", f"trainer.launcher={launcher}"],
        f"megarl train: error: reward.function.name=compute_score in reward.function.path={scorer} cannot be "
        "called as verl and megarl call it",
        "has no parameter data_source or extra_info. This is one of verl's per-source scorers",
    )
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
