"""Guards for an inference engine that shares its process with training.

vLLM changes process-wide state the training side relies on: it reseeds the global RNGs when an
engine starts and draws from them while sampling, and its CPU worker replaces `torch.set_num_threads`
with a no-op (after lowering the thread count). Wrap engine start-up and every engine call in
`engine_call` and the training side sees its RNG streams and thread settings exactly as it left them.
(The third trap, engine teardown destroying the default process group, is handled in `vllm_groups`.)
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import numpy as np
import torch

from megarl.distributed.platform import platform


@contextlib.contextmanager
def global_rng_preserved() -> Iterator[None]:
    """Restore Python's, NumPy's and torch's (CPU and every CUDA device's) global RNG states on exit."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cpu_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if platform().is_cuda else None
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        torch.set_rng_state(cpu_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


@contextlib.contextmanager
def torch_threads_preserved() -> Iterator[None]:
    """Restore `torch.set_num_threads` (the function itself) and the intra-op thread count on exit."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        set_num_threads(threads)


@contextlib.contextmanager
def engine_call() -> Iterator[None]:
    """Both guards, and the CPU shims' per-op mode off (the engine needs none of Megatron's CPU
    patches): use around creating an engine and around each call into it."""
    from megarl.distributed.cpu_shims import cuda_literal_suspended

    with global_rng_preserved(), torch_threads_preserved(), cuda_literal_suspended():
        yield
