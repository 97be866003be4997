"""`megarl bench engine-start`: a compiled vLLM engine's start in a fresh process, cold vs cached.

For each size (the e2e suite's random Llamas), one process after another, each starting megarl's
VLLMRollout (1 rank, rollout.enforce_eager=false: the model under torch.compile) and generating once:
first against an empty engine cache (`megarl.rollout.engine_cache`, here a directory of this run),
then against the cache the first one left. Timed in each: `import vllm`, the engine's construction
(`start`: config, architecture inspection, weights, compile or cache load, KV cache, warm-up), the
first generate (its own compiles), and the process's wall time. The goal: warm start / cold ≤ 0.3.
Writes `<out>/engine_start.json` and `engine_start.md`.

    python -m megarl.bench.engine_start SPEC.json RESULT.json   # one start (what each process runs)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from megarl.bench.e2e import SEED, SIZES
from megarl.bench.measure import run_measured, write_merged

PROMPT_TOKENS, NEW_TOKENS, PROMPTS = 24, 16, 4
PHASES = ("import_s", "start_s", "first_generate_s", "process_s")


def start_once(spec: dict) -> dict:
    """One engine start in this process, timed (see the module's docstring)."""
    t0 = time.perf_counter()
    # timed: the import every engine process pays (`import vllm` alone is lazy: ~3 s of the ~15 s here)
    from vllm import LLM  # noqa: F401

    imported = time.perf_counter()
    import torch
    import torch.distributed as dist

    from megarl.config.roles import rollout_spec
    from megarl.config.schema import MegarlConfig
    from megarl.protocol import Batch
    from megarl.rollout.engine_cache import ENV
    from megarl.rollout.vllm import VLLMRollout

    dist.init_process_group("gloo", init_method=f"file://{spec['store']}", rank=0, world_size=1)
    cfg = MegarlConfig()
    cfg.model.path, cfg.model.dtype = spec["model"], "fp32"
    cfg.data.max_prompt_length, cfg.data.max_response_length = PROMPT_TOKENS, NEW_TOKENS
    r = cfg.rollout
    r.n, r.kv_cache_memory_bytes, r.max_num_seqs, r.enforce_eager = 2, 64 << 20, 16, False
    rollout_cfg = rollout_spec(cfg)
    hit = any(Path(os.environ[ENV]).glob("*/engines/*.json"))  # an earlier start's marker (engine_cache)
    started = time.perf_counter()
    rollout = VLLMRollout(rollout_cfg)
    ready = time.perf_counter()
    ids = torch.randint(5, 500, (PROMPTS, PROMPT_TOKENS), generator=torch.Generator().manual_seed(0))
    out = rollout.generate(
        Batch({"prompts": ids, "attention_mask": torch.ones_like(ids)}), rollout_cfg.rollout
    )
    done = time.perf_counter()
    result = {
        "import_s": imported - t0,
        "start_s": ready - started,
        "first_generate_s": done - ready,
        "hit": hit,
        "tokens": out["responses"].tolist(),
    }
    rollout.close()
    dist.destroy_process_group()
    return result


def _start(model: Path, cache: Path, work: Path, label: str) -> dict:
    spec, result = work / f"{label}.json", work / f"{label}-result.json"
    store = work / f"{label}.store"
    store.unlink(missing_ok=True)
    spec.write_text(json.dumps({"model": str(model), "store": str(store)}))
    # one rank of its own (vLLM's external launcher reads the torchrun variables)
    ranks = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    env = {**os.environ, **ranks, "MEGARL_ENGINE_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "megarl.bench.engine_start", str(spec), str(result)]
    measured = run_measured(cmd, work / f"{label}.log", env=env, timeout_s=1800)
    return {
        **json.loads(result.read_text()),
        "process_s": measured.seconds,
        "peak_pss": measured.peak_rss_bytes,
    }


def run(args: argparse.Namespace) -> dict:
    from megarl.models.tiny import build_tiny_hf
    from megarl.observe.machine import cpu_model

    root = Path(args.out)
    result: dict = {"cpu": cpu_model(), "sizes": {}}
    for name in args.sizes:
        size, work = SIZES[name], root / "engine_start" / name
        model = work / "model"
        if not (model / "config.json").exists():
            build_tiny_hf(model, family="llama", seed=SEED, **size.model)
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)  # the first start finds nothing
        print(f"bench engine-start {name}: cold start (empty cache {cache}) …", flush=True)
        cold = _start(model, cache, work, "cold")
        print(f"  cold {cold['start_s']:.1f} s; warm start …", flush=True)
        warm = _start(model, cache, work, "warm")
        result["sizes"][name] = {
            "cold": {k: v for k, v in cold.items() if k != "tokens"},
            "warm": {k: v for k, v in warm.items() if k != "tokens"},
            "start_ratio": warm["start_s"] / cold["start_s"],
            "start_and_generate_ratio": (warm["start_s"] + warm["first_generate_s"])
            / (cold["start_s"] + cold["first_generate_s"]),
            "process_ratio": warm["process_s"] / cold["process_s"],
            "same_tokens": cold["tokens"] == warm["tokens"],
        }
        print(f"  warm {warm['start_s']:.1f} s: {result['sizes'][name]['start_ratio']:.2f} of cold")
    return write_merged(root / "engine_start.json", "sizes", result, list(SIZES), table)


def table(result: dict) -> str:
    lines = [
        "# megarl bench engine-start — a compiled vLLM engine's start, empty cache vs cached",
        "",
        f"CPU: {result.get('cpu', '?')}. Fresh process each; seconds. Goal: warm start / cold ≤ 0.3.",
        "",
        "| size | run | import vllm | engine start | first generate | process | cache hit |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in result["sizes"].items():
        for run_name in ("cold", "warm"):
            x = r[run_name]
            lines.append(
                f"| {name} | {run_name} | {x['import_s']:.1f} | {x['start_s']:.1f} | "
                f"{x['first_generate_s']:.1f} | {x['process_s']:.1f} | {'yes' if x['hit'] else 'no'} |"
            )
        lines.append(
            f"| {name} | **warm / cold** | | **{r['start_ratio']:.2f}** | "
            f"({r['start_and_generate_ratio']:.2f} with it) | {r['process_ratio']:.2f} | "
            f"same tokens: {r['same_tokens']} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default="outputs/bench")
    parser.add_argument("--sizes", nargs="+", default=["tiny"], choices=list(SIZES))


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(json.dumps(start_once(json.loads(Path(sys.argv[1]).read_text()))))
