"""A standalone vLLM engine replaying the generate calls a trainer's engine made (`megarl bench rollout`).

    python vllm_standalone.py SPEC.json RESULT.json

SPEC: {"engine": vllm.LLM's arguments, "calls": [{"prompts": [[token id, ...], ...],
"params": [vllm.SamplingParams' arguments per prompt]}, ...]}. Plain vLLM in this process only (no
torch.distributed, no Megatron, no megarl): the in-process engine core, torch's threads from
OMP_NUM_THREADS. Each call is timed around `generate`, the prefix cache emptied before it (the trainer's
engine empties it at every weight sync); RESULT: {"seconds": [per call], "token_ids":
[per call: [per sample, prompt-major: [token id, ...]]]}.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def main(spec_path: str, result_path: str) -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(spec_path).read_text())
    llm = LLM(**spec["engine"])
    seconds, token_ids = [], []
    for call in spec["calls"]:
        params = [SamplingParams(**p) for p in call["params"]]
        prompts = [{"prompt_token_ids": p} for p in call["prompts"]]
        llm.reset_prefix_cache()  # as the trainer's engine after each weight sync: the same prefill work
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
        token_ids.append(
            [list(c.token_ids) for out in outputs for c in sorted(out.outputs, key=lambda c: c.index)]
        )
    Path(result_path).write_text(json.dumps({"seconds": seconds, "token_ids": token_ids}))
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
