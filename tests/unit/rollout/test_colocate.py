"""The guards that keep an engine's global side effects (RNG reseeding, thread settings) out of training."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from megarl.rollout.colocate import engine_call, global_rng_preserved, torch_threads_preserved

pytestmark = pytest.mark.unit


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_global_rngs_continue_as_if_the_engine_never_ran():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = draws()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with global_rng_preserved():
        random.seed(7), np.random.seed(7), torch.manual_seed(7)  # what vLLM's LLM(seed=7) does
        draws()
    assert draws() == expected


def test_set_num_threads_and_thread_count_are_restored():
    original, threads = torch.set_num_threads, torch.get_num_threads()
    try:
        with torch_threads_preserved():
            torch.set_num_threads(1)
            torch.set_num_threads = lambda n: None  # what vLLM's CPU worker does
        assert torch.set_num_threads is original
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads = original
        original(threads)


def test_engine_call_restores_both_even_on_error():
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    original = torch.set_num_threads
    with pytest.raises(RuntimeError), engine_call():
        torch.manual_seed(9)
        torch.set_num_threads = lambda n: None
        raise RuntimeError("engine failed")
    assert torch.set_num_threads is original
    assert torch.equal(torch.rand(2), expected)
