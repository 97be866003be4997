"""The engine cache's directory and keys: what makes two engine starts share a compile, and what not."""

from __future__ import annotations

import json
import os

import pytest
import torch

from megarl.rollout import engine_cache as ec

pytestmark = pytest.mark.unit


def model_dir(tmp_path, name: str, **config):
    path = tmp_path / name
    path.mkdir()
    config = {"model_type": "llama", "hidden_size": 128, "_name_or_path": str(path), **config}
    (path / "config.json").write_text(json.dumps(config))
    return path


def kwargs(model, **over) -> dict:
    return {"model": str(model), "tokenizer": str(model), "seed": 0, "dtype": "float32",
            "kv_cache_memory_bytes": 1 << 24, "enforce_eager": False, "max_model_len": 64, **over}  # fmt: skip


def test_key_ignores_paths_seed_and_memory_but_not_architecture_or_compile_args(tmp_path):
    a, b = model_dir(tmp_path, "a"), model_dir(tmp_path, "b")  # same config.json, other weights/paths
    wider = model_dir(tmp_path, "wider", hidden_size=256)
    key = ec.engine_key(kwargs(a))
    assert ec.engine_key(kwargs(b, seed=3, kv_cache_memory_bytes=1 << 26)) == key
    assert ec.engine_key(kwargs(wider)) != key
    assert ec.engine_key(kwargs(a, max_model_len=128)) != key
    assert ec.engine_key(kwargs(a, dtype="bfloat16")) != key


def test_directory_names_torch_vllm_python_and_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(ec.ENV, str(tmp_path / "cache"))
    cache = ec.engine_cache(kwargs(model_dir(tmp_path, "m")))
    assert cache.directory.parent == tmp_path / "cache"
    name = cache.directory.name
    assert name.startswith(f"torch-{torch.__version__.replace('+', '-')}_vllm-") and "_py3." in name
    assert cache.environ() == {
        "VLLM_CACHE_ROOT": str(cache.directory / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache.directory / "inductor"),
    }
    monkeypatch.setenv(ec.ENV, "off")
    assert ec.engine_cache(kwargs(model_dir(tmp_path, "n"))) is None


def test_default_root_is_per_user(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ec.default_root() == tmp_path / ".cache" / "megarl" / "engine"


def test_cached_start_points_vllm_there_and_marks_the_config_started(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ec.ENV, str(tmp_path / "cache"))
    for name in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(name, "elsewhere")  # restored after the test
    args = kwargs(model_dir(tmp_path, "m"))
    with ec.cached_start(args) as cache:
        assert os.environ["VLLM_CACHE_ROOT"] == str(cache.directory / "vllm")
        assert not cache.hit
    assert "engine cache miss" in capsys.readouterr().out
    with ec.cached_start(args) as again:
        assert again.hit
    assert "engine cache hit" in capsys.readouterr().out
    with (
        pytest.raises(RuntimeError),
        ec.cached_start(kwargs(model_dir(tmp_path, "w"), dtype="bf16")) as failed,
    ):
        raise RuntimeError("the engine failed to start")
    assert not failed.hit  # a failed start marks nothing


def test_plain_inductor_artifacts_get_a_no_op_finalize(monkeypatch):
    class Artifacts:
        compiled_fn = staticmethod(lambda *a: None)

    class Loaded:
        _artifacts = Artifacts()

    monkeypatch.setattr(torch.compiler, "load_compiled_function", lambda f, f_globals=None: Loaded())
    ec._finalize_plain_inductor_artifacts()
    ec._finalize_plain_inductor_artifacts()  # idempotent: wraps once
    loaded = torch.compiler.load_compiled_function(None, f_globals={})
    assert loaded._artifacts.compiled_fn.finalize_loading(None) is None
