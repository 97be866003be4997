"""An export never writes over what it reads or over a training run, and a failed one leaves nothing
behind: errors name the side at fault (the checkpoint read or the output written)."""

import errno
import os
from pathlib import Path

import pytest

from megarl.checkpoint.format import CheckpointError
from megarl.checkpoint.hf_export import export_checkpoint_hf
from megarl.output_guard import OutputPathError, OutputWriteError, overlap
from tests.helpers.checkpoints import fake_megatron_checkpoint, fake_run

pytestmark = [pytest.mark.unit, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]


def tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def test_overlap_names_how_two_paths_meet(tmp_path):
    assert overlap(tmp_path / "a", tmp_path / "a/") == "is"
    assert overlap(tmp_path, tmp_path / "a" / "b") == "contains"
    assert overlap(tmp_path / "a" / "b", tmp_path / "a") == "lies inside"
    assert overlap(tmp_path / "a", tmp_path / "ab") is None
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert overlap(tmp_path / "link" / "hf", tmp_path / "real") == "lies inside"


@pytest.mark.parametrize("out", ["run", "actor", "actor/export", "run/checkpoints"])
def test_an_export_over_its_own_checkpoint_or_run_is_refused_and_nothing_is_touched(
    tiny_models, tmp_path, out
):
    role = fake_run(tiny_models["llama"], tmp_path / "run")
    before = tree(tmp_path)
    target = role if out == "actor" else role / "export" if out == "actor/export" else tmp_path / out
    how = {"run": "contains", "actor": "is", "actor/export": "lies inside", "run/checkpoints": "contains"}[
        out
    ]
    with pytest.raises(OutputPathError, match=rf"--out {target} {how} the checkpoint it exports"):
        export_checkpoint_hf(role, target, overwrite=True)
    assert tree(tmp_path) == before


def test_overwrite_never_removes_another_run_but_replaces_an_earlier_export(tiny_models, tmp_path):
    role = fake_run(tiny_models["llama"], tmp_path / "run")
    other = tmp_path / "other_run"
    fake_run(tiny_models["llama"], other)
    before = tree(other)
    with pytest.raises(
        OutputPathError, match=r"holds a megarl training run or checkpoint .*--overwrite never"
    ):
        export_checkpoint_hf(role, other, overwrite=True)
    assert tree(other) == before
    export_checkpoint_hf(role, tmp_path / "hf")
    export_checkpoint_hf(role, tmp_path / "hf", overwrite=True)  # an export is not a run: replaced
    assert (tmp_path / "hf" / "config.json").is_file() and not (tmp_path / "hf.partial").exists()


def test_overwrite_of_a_file_is_refused_and_leaves_no_partial(tiny_models, tmp_path):
    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    (tmp_path / "out").write_text("notes")
    with pytest.raises(OutputPathError, match=r"--out .*out is a file, not a directory"):
        export_checkpoint_hf(ckpt, tmp_path / "out", overwrite=True)
    assert (tmp_path / "out").read_text() == "notes" and not (tmp_path / "out.partial").exists()


def test_a_truncated_shard_without_a_manifest_is_named_and_leaves_no_partial(tiny_models, tmp_path):
    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")  # as hf-to-mcore writes
    shard = next((ckpt / "model").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"{shard} is truncated: \d+ bytes, its records need \d+"):
        export_checkpoint_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()


def test_a_read_only_output_is_blamed_not_the_checkpoint(tiny_models, tmp_path, monkeypatch):
    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    out = tmp_path / "ro" / "hf"
    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):  # the fault: a read-only mount (chmod does not stop root)
        if str(self).startswith(str(tmp_path / "ro")):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(OutputWriteError) as e:
        export_checkpoint_hf(ckpt, out)
    assert (
        str(e.value) == f"{out} cannot be written (Read-only file system); choose a location you can write to"
    )
    assert e.value.exit_code == 2


def test_a_full_disk_mid_export_names_the_output_and_the_space(tiny_models, tmp_path, monkeypatch):
    from megarl.models.convert.safetensors_shards import ShardWriter

    ckpt = fake_megatron_checkpoint(tiny_models["llama"], tmp_path / "ckpt")
    calls = []
    write = ShardWriter.write

    def fills_up(self, name, tensor):  # the fault: the disk fills after a few tensors
        calls.append(name)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, name, tensor)

    monkeypatch.setattr(ShardWriter, "write", fills_up)
    with pytest.raises(
        OutputWriteError,
        match=rf"^no space left on the device of {tmp_path / 'hf'} \(about "
        r"[\d.]+ [KM]B needed, [\d.]+ [KMGT]B free\); free some space or write elsewhere$",
    ):
        export_checkpoint_hf(ckpt, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "hf.partial").exists()


def test_a_conversion_into_a_read_only_place_is_blamed_on_every_rank(tmp_path, monkeypatch):
    import torch.distributed as dist

    from megarl.checkpoint.format import begin_write

    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):  # the fault: a read-only mount
        if ".partial" in str(self):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(OutputWriteError, match=rf"^{tmp_path / 'out'} cannot be written \(Read-only"):
            begin_write(tmp_path / "out")
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "out.partial").exists()


def test_the_run_markers_are_the_names_the_writers_use():
    from megarl.checkpoint.manifest import MANIFEST_FILE
    from megarl.checkpoint.paths import CHECKPOINTS_DIR, LATEST_FILE
    from megarl.checkpoint.run import TRAINER_STATE
    from megarl.observe.run_files import METRICS, RUN_INFO
    from megarl.output_guard import RUN_MARKERS
    from megarl.trainer.run_lock import LOCK_FILE

    names = {CHECKPOINTS_DIR, METRICS, RUN_INFO, LOCK_FILE, TRAINER_STATE, LATEST_FILE, MANIFEST_FILE}
    assert set(RUN_MARKERS) == names
