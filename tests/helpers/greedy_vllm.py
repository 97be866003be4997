"""Greedy answers of a plain vLLM engine (in-process, CPU) on an HF model directory, as a subprocess:

    python -m tests.helpers.greedy_vllm MODEL_DIR REQUEST_JSON OUT_JSON

REQUEST_JSON = {"prompt_token_ids": [[...], ...], "max_tokens": N, "max_model_len": M}; OUT_JSON gets
the generated token ids of each prompt (EOS included, as the trainer's rollout records them)."""

from __future__ import annotations

import json
import os
import sys


def main(model: str, request_path: str, out_path: str) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    request = json.loads(open(request_path).read())
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=64 * 2**20,
        max_model_len=request["max_model_len"],
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=request["max_tokens"])
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["prompt_token_ids"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    with open(out_path, "w") as f:
        json.dump([list(o.outputs[0].token_ids) for o in outputs], f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
