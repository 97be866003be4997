"""What an in-process vLLM engine's start pays that it need not, taken off before `vllm.LLM(...)`.

Both were found by profiling one engine start (tiny Llama, enforce_eager, cache hit) in a process that
had imported megatron-core, as every trainer rank has:

- **Five full garbage collections** (memory profiling, then `freeze_gc_heap`), each a pass over the
  whole heap of the process: megatron, transformers, the trainer's models (~0.3 s each with megatron
  imported alone, more with models built). vLLM freezes the heap at the end of its start anyway
  (`gc.freeze`: everything alive moves to the permanent generation); `frozen_heap` collects once and
  freezes before the start, so those passes see only the engine's new objects. The effect on the
  process after the start is the one vLLM's own freeze has.
- **A torch.compile of the sampled token's rank** (`batched_count_greater_than`: how many vocabulary
  entries have a log-prob at least the sampled one's) on the first `generate` that returns log-probs:
  2-3 s of Dynamo tracing per process on CPU, to save ~0.1 ms per decode step at a 1k vocabulary and
  ~2 ms at 32k (64 rows, 1 thread). `ranks_compiled_when_large` counts eagerly below `EAGER_MAX`
  elements, where eager is within ~0.1 ms of the compiled kernel, and compiles only for larger calls.
  CPU only: on a GPU the compiled kernel is there to avoid a (rows × vocab) temporary.
"""

from __future__ import annotations

import gc

import torch

# rows × vocabulary below which the rank is counted eagerly: a ~1M-element comparison, ~0.1 ms on one
# core; past it the compiled kernel's per-step gain soon repays its one-time compile
EAGER_MAX = 1 << 20


def frozen_heap() -> None:
    """Collect once and freeze the heap (`gc.freeze`), as vLLM does at the end of its start."""
    gc.collect()
    gc.freeze()


def ranks_compiled_when_large() -> None:
    """Point vLLM's sampler at a rank count that runs eagerly for calls below `EAGER_MAX` elements and
    calls vLLM's compiled one otherwise (idempotent; the counts are the same integers either way)."""
    import vllm.v1.sample.sampler as sampler

    compiled = sampler.batched_count_greater_than
    if getattr(compiled, "megarl_eager_below", None) is not None:
        return
    eager = compiled._torchdynamo_orig_callable

    def count_greater_than(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        return eager(x, values) if x.numel() < EAGER_MAX else compiled(x, values)

    count_greater_than.megarl_eager_below = EAGER_MAX  # type: ignore[attr-defined]
    sampler.batched_count_greater_than = count_greater_than


def before_start(on_cuda: bool) -> None:
    """What to take off before `vllm.LLM(...)`: the eager rank count on CPU, the frozen heap everywhere."""
    if not on_cuda:
        ranks_compiled_when_large()
    frozen_heap()
