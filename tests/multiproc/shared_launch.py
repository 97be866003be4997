"""Rank code that runs several test modules' 4-rank programs in one launch (tests/multiproc/conftest.py,
`shared_launch`): on 2 cores a 4-rank launch costs ≈ 15–20 s before its first check (torchrun, and torch
and megatron imported by 4 processes), more than the checks of some modules.

argv: a JSON list of [name, "module[:function]", argv] run in that order on every rank. Rank 0 returns
{name: {"result": what the part returned} or {"error": …, "traceback": …}, with "seconds" it took and the
"threads" the process holds after it (a part that leaves process groups alive shows here: each gloo group holds 3)}: a part that raises on every
rank is reported and the next one runs. (A part raising on some ranks only leaves the others waiting in
a collective: the launch then times out, and every part's tests fail with the ranks' output.)
"""

from __future__ import annotations

import json
import time
import traceback

from megarl.distributed.rank_program import find_rank_function


def forget_dtensor_shardings() -> None:
    """Empty DTensor's sharding caches (torch's C++ one and its Python one). A device mesh equals any
    other of the same ranks and shape whatever its process group, so a part's DTensor ops would reuse the
    shardings cached by an earlier part — holding that part's mesh, whose group may be destroyed since
    (ParallelLayout.destroy): "Could not resolve the process group registered under the name …"."""
    import torch
    from torch.distributed.tensor import DTensor

    torch._C._clear_DTensor_sharding_propagator_cache()
    DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()


def _os_threads() -> int:
    """This process's threads as the OS counts them (gloo's and vLLM's C++ threads included)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def main(argv: list[str]) -> dict:
    (parts,) = argv
    results: dict = {}
    for name, target, args in json.loads(parts):
        forget_dtensor_shardings()
        start = time.monotonic()
        try:
            results[name] = {"result": find_rank_function(target)(args)}
        except Exception as e:
            traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        results[name]["seconds"] = round(time.monotonic() - start, 1)
        results[name]["threads"] = _os_threads()
    return results
