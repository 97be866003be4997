"""`megarl convert`: HF -> megatron dist-checkpoint at a TP/PP layout -> HF is bit-exact; the export of a
run's checkpoint is sharded like save_pretrained and loads in transformers (vLLM on a run's export: tests/e2e/test_resume.py)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from megarl.checkpoint.manifest import write_manifest
from megarl.models.convert.hf_io import HFCheckpointReader

pytestmark = pytest.mark.multiproc

# TP splitting of both families, PP splitting (family-agnostic) once, the scalar head under TP, routed
# experts split over EP and expert-TP (TP2 x EP2, 4 ranks); each case costs one torchrun launch (~30 s)
# plus an in-process export (~7 s), so no more than that.
# The qwen2 case is exported from a run's checkpoint tree, through `latest`, into >= 3 shards.
CASES = {
    "qwen2-tp2pp2-run": ("qwen2", 2, 2, 1, "lm"),
    "llama-tp2-scalar": ("llama", 2, 1, 1, "scalar"),
    "qwen2_moe-tp2ep2": ("qwen2_moe", 2, 1, 2, "lm"),
}
SHARD = "1MB"  # the tiny Qwen2 is 2.9 MB in fp32


def megarl(*argv):
    return subprocess.run(
        [sys.executable, "-m", "megarl.cli", *map(str, argv)], capture_output=True, text=True
    )


def as_run_checkpoint(role_dir: Path) -> Path:
    """Dress a converted checkpoint up as a run's step_3 actor: training state beside the weights, a
    newer interrupted save, `latest` written last. Returns the run directory."""
    for extra in ("optimizer", "rng"):
        (role_dir / extra).mkdir()
        (role_dir / extra / "junk.pt").write_bytes(b"not weights")
    (role_dir / "scheduler.json").write_text("{}")
    write_manifest(role_dir)  # the export checks every file against it
    checkpoints = role_dir.parent.parent
    (checkpoints / "step_5.partial" / "actor").mkdir(parents=True)
    (checkpoints / "latest").write_text("step_3\n")
    return checkpoints.parent


@pytest.fixture(scope="module")
def converted(tiny_models, tiny_reward_models, tmp_path_factory):
    """converted(case) -> (source HF dir, exported HF dir), each case converted once per module."""
    done = {}

    def convert(case: str) -> tuple[Path, Path]:
        if case in done:
            return done[case]
        family, tp, pp, ep, head = CASES[case]
        tmp = tmp_path_factory.mktemp(case)
        if family.endswith("_moe"):
            from megarl.models.tiny import build_tiny_hf

            source = build_tiny_hf(tmp / "source", family=family, num_hidden_layers=2)
        else:
            source = (tiny_models if head == "lm" else tiny_reward_models)[family]
        run_layout = case.endswith("-run")
        ckpt = tmp / "run/checkpoints/step_3/actor" if run_layout else tmp / "mcore"
        to_mcore = megarl(
            "convert", "hf-to-mcore", "--hf", source, "--out", ckpt, "--tp", tp, "--pp", pp, "--ep", ep
        )
        assert to_mcore.returncode == 0, to_mcore.stderr[-3000:]
        assert not Path(f"{ckpt}.partial").exists()
        back = tmp / "hf"
        if run_layout:
            to_hf = megarl(
                "convert",
                "mcore-to-hf",
                "--ckpt",
                as_run_checkpoint(ckpt),
                "--out",
                back,
                "--max-shard-size",
                SHARD,
            )
        else:
            to_hf = megarl("convert", "mcore-to-hf", "--ckpt", ckpt, "--out", back)
        assert to_hf.returncode == 0, to_hf.stderr[-3000:]
        assert json.loads(to_hf.stdout.splitlines()[-1])["from"] == str(ckpt)
        assert not (tmp / "hf.partial").exists()
        done[case] = source, back
        return done[case]

    return convert


@pytest.mark.parametrize("case", CASES)
def test_hf_to_mcore_to_hf_round_trip_is_bit_exact(converted, case):
    source, back = converted(case)
    original = load_file(source / "model.safetensors")
    restored = HFCheckpointReader(back)
    assert sorted(original) == sorted(restored.names())
    for name, tensor in original.items():
        assert restored.get(name).dtype == tensor.dtype and torch.equal(restored.get(name), tensor), name
    assert (back / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert (back / "config.json").read_bytes() == (source / "config.json").read_bytes()


def test_small_model_exports_as_one_file(converted):
    _, back = converted("llama-tp2-scalar")
    assert sorted(p.name for p in back.glob("model*")) == ["model.safetensors"]


def test_run_export_is_sharded_with_save_pretrained_names_and_index(converted):
    source, back = converted("qwen2-tp2pp2-run")
    index = json.loads((back / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in back.glob("*.safetensors"))
    assert len(files) >= 3 and files == sorted(set(index["weight_map"].values()))
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert all((back / f).stat().st_size <= 10**6 + 4096 for f in files)  # + the header
    original = load_file(source / "model.safetensors")
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in original.values())
    assert not (back / "optimizer").exists() and not (back / "scheduler.json").exists()


def test_transformers_loads_the_sharded_export_with_equal_weights_and_logits(converted):
    from transformers import AutoModelForCausalLM

    source, back = converted("qwen2-tp2pp2-run")
    exported = AutoModelForCausalLM.from_pretrained(back, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    ours, theirs = exported.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    tokens = torch.randint(0, exported.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (exported(tokens).logits - reference(tokens).logits).abs().max().item()
    assert diff <= 5e-5
