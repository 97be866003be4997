"""The machine's measured rates for a roofline: GEMM FLOP/s per shape and memory bandwidth.

CPU: `procs` processes × 1 thread measure at once (megarl's ranks run so), each shape with torch.matmul
and, where megarl's linear layers use it, OpenBLAS (`models/cpu_gemm.py`), the faster one kept; the
rates of the processes add up. CUDA: one process, bf16 matmuls, plus the card's nominal dense bf16 peak
(MFU is quoted against it).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import time

CAP = 2048  # a dimension beyond this runs at the same rate; measuring it would only take longer
MIN_SECONDS = 0.2
PASSES = 2
BANDWIDTH_MIB = 256
# dense bf16 tensor-core peaks (no sparsity), FLOP/s
NOMINAL_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12}


def _best_seconds(fn, sync=None) -> float:
    fn()  # warm: first touch, kernel selection
    best, spent = float("inf"), 0.0
    while spent < MIN_SECONDS or best == float("inf"):
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return best


def _fastest(shape, multiplies, device, dtype, sync, barrier) -> dict:
    import torch

    m, k, n = shape
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    best = {}
    for name, multiply in multiplies:
        if barrier is not None:
            barrier.wait()
        best[name] = 2 * m * k * n / _best_seconds(functools.partial(multiply, a, b), sync)
    fastest = max(best, key=best.get)
    return {"flops_per_s": best[fastest], "by": fastest}


def _measure(shapes: list[tuple[int, int, int]], device: str, barrier=None) -> dict:
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else None
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    multiplies = [("torch", torch.matmul)]
    if device == "cpu":
        torch.set_num_threads(1)
        from megarl.models.cpu_gemm import mm, openblas_chosen

        if openblas_chosen():
            multiplies.append(("openblas", mm))
    capped = sorted({(min(m, CAP), min(k, CAP), min(n, CAP)) for m, k, n in shapes})
    measured: dict[tuple[int, int, int], dict] = {}
    # PASSES sweeps, the best of them kept: a burst of other work on a shared machine then lowers one
    # shape's rate only if it comes back at that shape's turn in every sweep
    for sweep in range(PASSES):
        for shape in capped if sweep % 2 == 0 else capped[::-1]:
            rate = _fastest(shape, multiplies, device, dtype, sync, barrier)
            if shape not in measured or rate["flops_per_s"] > measured[shape]["flops_per_s"]:
                measured[shape] = rate
    rates = {f"{m}x{k}x{n}": measured[(min(m, CAP), min(k, CAP), min(n, CAP))] for m, k, n in shapes}
    src = torch.ones(BANDWIDTH_MIB * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    if barrier is not None:
        barrier.wait()
    copy = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), sync)  # read + write
    read = src.numel() * 4 / _best_seconds(lambda: src.sum(), sync)
    return {"gemm": rates, "bandwidth_bytes_per_s": max(copy, read), "copy": copy, "read": read}


def _worker(shapes, barrier, queue) -> None:
    queue.put(_measure(shapes, "cpu", barrier))


def measure_peaks(shapes: list[tuple[int, int, int]], device: str = "cpu", procs: int = 2) -> dict:
    """{"gemm": {"MxKxN": {"flops_per_s", "by"}}, "bandwidth_bytes_per_s", "peak_flops_per_s", ...}: the
    whole machine's rates (CPU: the sum over `procs` concurrent 1-thread processes)."""
    if device == "cuda":
        import torch

        out = _measure(shapes, "cuda")
        name = torch.cuda.get_device_name()
        nominal = next((v for k, v in NOMINAL_BF16.items() if k in name), None)
        out.update(device=name, procs=1, nominal_flops_per_s=nominal)
    else:
        ctx = mp.get_context("spawn")
        barrier, queue = ctx.Barrier(procs), ctx.Queue()
        workers = [ctx.Process(target=_worker, args=(shapes, barrier, queue)) for _ in range(procs)]
        for w in workers:
            w.start()
        parts = [queue.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        out = {
            "gemm": {
                s: {
                    "flops_per_s": sum(p["gemm"][s]["flops_per_s"] for p in parts),
                    "by": parts[0]["gemm"][s]["by"],
                }
                for s in parts[0]["gemm"]
            },
            **{key: sum(p[key] for p in parts) for key in ("bandwidth_bytes_per_s", "copy", "read")},
            "device": "cpu",
            "procs": procs,
            "nominal_flops_per_s": None,
        }
    out["peak_flops_per_s"] = max(r["flops_per_s"] for r in out["gemm"].values())
    return out
