"""`megarl` sub-commands reject bad input with exit code 2 and a message that says what to fix."""

import json
import re
from pathlib import Path

import pytest

from megarl.cli import main

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = str(REPO / "configs" / "quickstart_grpo.yaml")


@pytest.fixture(scope="module")
def hf_config_dir(tmp_path_factory):
    """A config-only HF dir (4 heads, 2 kv heads, 4 layers): enough for every pre-launch check."""
    d = tmp_path_factory.mktemp("hf")
    config = {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "vocab_size": 1001,
    }
    (d / "config.json").write_text(json.dumps(config))
    return d


def run(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_config_show_prints_the_resolved_config(capsys):
    code, out, _ = run(["config", "show", QUICKSTART, "--no-check-paths", "actor.parallel.tp=2"], capsys)
    assert code == 0
    assert "tp: 2" in out and "rollout:" in out


def test_config_show_rejects_bad_values_naming_key_and_fix(capsys):
    code, _, err = run(["config", "show", QUICKSTART, "--no-check-paths", "actor.paralel.tp=2"], capsys)
    assert code == 2
    assert "actor.paralel" in err and "did you mean 'actor.parallel'" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--tp", "3"],
            "--tp=3 does not divide num_attention_heads=4 and num_key_value_heads=2; use one of 1, 2",
        ),
        (["--pp", "3"], "--pp=3 does not divide num_hidden_layers=4"),
        (["--tp", "2", "--nproc", "3"], "tp·pp·cp = 2·1·1 = 2 does not divide --nproc=3"),
        (["--tp", "0"], "--tp=0 must be ≥ 1"),
        (["--vpp", "2"], "--vpp=2 needs --pp > 1; drop --vpp or raise --pp"),
        (["--sequence-parallel"], "--sequence-parallel needs --tp > 1; drop --sequence-parallel"),
    ],
)
def test_verify_model_rejects_impossible_layouts_before_launching(hf_config_dir, capsys, argv, message):
    code, _, err = run(["verify-model", "--hf", str(hf_config_dir), *argv], capsys)
    assert code == 2
    assert message in err


def test_verify_model_refuses_lora_in_bf16(hf_config_dir, tmp_path, capsys):
    argv = ["verify-model", "--hf", str(hf_config_dir), "--lora-adapter", str(tmp_path), "--dtype", "bf16"]
    code, _, err = run(argv, capsys)
    assert code == 2 and "compares with PEFT in fp32 only" in err


def test_verify_model_names_a_missing_checkpoint(tmp_path, capsys):
    code, _, err = run(["verify-model", "--hf", str(tmp_path / "nope")], capsys)
    assert code == 2 and "no config.json there" in err


def test_convert_refuses_to_overwrite_an_existing_output(hf_config_dir, tmp_path, capsys):
    code, _, err = run(["convert", "hf-to-mcore", "--hf", str(hf_config_dir), "--out", str(tmp_path)], capsys)
    assert code == 2 and "already exists" in err


def test_mcore_to_hf_rejects_a_directory_that_is_not_a_checkpoint(hf_config_dir, tmp_path, capsys):
    code, _, err = run(
        ["convert", "mcore-to-hf", "--ckpt", str(hf_config_dir), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "is not a megarl checkpoint" in err and "megarl convert hf-to-mcore" in err


def test_mcore_to_hf_names_an_unfinished_conversion(tmp_path, capsys):
    (tmp_path / "ckpt.partial").mkdir()
    code, _, err = run(
        ["convert", "mcore-to-hf", "--ckpt", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "was never completed" in err


def test_mcore_to_hf_names_corrupt_metadata(tmp_path, capsys):
    (tmp_path / "megarl_checkpoint.json").write_text("{not json")
    code, _, err = run(
        ["convert", "mcore-to-hf", "--ckpt", str(tmp_path), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "is corrupt" in err


def test_mcore_to_hf_of_a_run_names_its_interrupted_save(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints" / "step_4.partial" / "actor").mkdir(parents=True)
    code, _, err = run(
        ["convert", "mcore-to-hf", "--ckpt", str(tmp_path / "run"), "--out", str(tmp_path / "o")], capsys
    )
    assert code == 2 and "no complete checkpoint (only step_4.partial, interrupted)" in err


def test_mcore_to_hf_rejects_a_bad_max_shard_size(tmp_path, capsys):
    argv = ["convert", "mcore-to-hf", "--ckpt", str(tmp_path), "--out", str(tmp_path / "o")]
    code, _, err = run([*argv, "--max-shard-size", "5 apples"], capsys)
    assert code == 2 and "--max-shard-size" in err and "'5GB'" in err


def test_unsupported_architecture_is_named(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "num_attention_heads": 4}))
    code, _, err = run(["verify-model", "--hf", str(tmp_path)], capsys)
    assert code == 2 and "model_type='gpt2' is not supported" in err


def test_data_make_lists_the_files_on_stdout_and_its_progress_on_stderr(tmp_path, capsys):
    argv = f"data make digits_sort --out {tmp_path} --n-train 8 --n-val 4 --n-sft 8 --n-pref 6".split()
    code, out, err = run(argv, capsys)
    splits = [line.split()[0] for line in out.splitlines()]
    assert code == 0 and splits == ["train", "val", "sft", "preference", "kto"]
    assert re.fullmatch(
        r"making digits_sort: 8 train, 4 val, 8 sft, 6 preference and kto examples … done in \d+\.\d s\n", err
    )


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("out", ["run", "actor"])
def test_mcore_to_hf_over_its_own_run_is_refused_and_the_run_kept(tiny_models, tmp_path, capsys, out):
    from tests.helpers.checkpoints import fake_run

    role = fake_run(tiny_models["llama"], tmp_path / "run")
    files = sorted(p for p in tmp_path.rglob("*"))
    target = tmp_path / "run" if out == "run" else role
    argv = ["convert", "mcore-to-hf", "--ckpt", str(tmp_path / "run"), "--out", str(target), "--overwrite"]
    code, _, err = run(argv, capsys)
    how = "contains" if out == "run" else "is"
    assert code == 2 and f"--out {target} {how} the checkpoint --ckpt names ({role})" in err, err
    assert sorted(p for p in tmp_path.rglob("*")) == files


def test_hf_to_mcore_output_over_its_input_or_a_file_is_refused(hf_config_dir, tmp_path, capsys):
    argv = ["convert", "hf-to-mcore", "--hf", str(hf_config_dir), "--overwrite", "--out"]
    code, _, err = run([*argv, str(hf_config_dir / "mcore")], capsys)
    assert code == 2 and f"lies inside --hf ({hf_config_dir})" in err
    (tmp_path / "f").write_text("x")
    code, _, err = run([*argv, str(tmp_path / "f")], capsys)
    assert code == 2 and "is a file, not a directory" in err and not (tmp_path / "f.partial").exists()
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # a training run
    code, _, err = run([*argv, str(tmp_path / "run")], capsys)
    assert (
        code == 2 and f"holds a megarl training run or checkpoint ({tmp_path / 'run' / 'checkpoints'})" in err
    )
    assert (tmp_path / "run" / "checkpoints").is_dir()
