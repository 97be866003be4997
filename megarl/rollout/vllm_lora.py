"""Adapter-only weight sync into an in-process vLLM engine: the LoRA adapter arrives as tensors, no files.

The engine runs with LoRA enabled (`engine_lora_kwargs`) and one adapter slot. `install_adapter` runs on
the engine's worker (`LLM.collective_rpc`): it builds vLLM's `LoRAModel` from PEFT-named tensors and
registers it under the fixed id `ADAPTER_ID`, replacing the adapter there before, and every request the
rollout submits afterwards carries `adapter_request()`. Since that request is always already loaded, the
worker never reads its path.

What the engine holds, per LoRA layer (vLLM 0.32): `lora_a_stacked[s]` [slots, 1, max_lora_rank, in] and
`lora_b_stacked[s]` [slots, 1, out, max_lora_rank], one `s` per projection packed into the layer
(qkv_proj: q, k, v; gate_up_proj: gate, up; o_proj, down_proj: one), no transpose. PEFT's A [r, in]
fills rows :r of the slot, B [out, r] columns :r, multiplied by the scaling alpha/r. With engine TP > 1
each rank keeps its region of each tensor (`engine_region`), the rest of a full-shaped tensor it is
handed is ignored.
"""

from __future__ import annotations

import re
import time
import typing

import torch

from megarl.config.schema_lora import MEGATRON_LINEARS, PROJECTIONS
from megarl.models.lora.targets import PROJECTIONS as LORA_PROJECTIONS

# The engine's only adapter slot: the current policy's adapter, replaced at every sync.
ADAPTER_ID = 1
ADAPTER_NAME = "megarl-policy"
# Never read (the adapter is installed before any request names it), but vLLM wants a path; it is also
# part of the prefix-cache key.
_ADAPTER_PATH = "megarl://in-memory-adapter"

# target_modules names → the Hugging Face projections they cover
_HF_LINEARS = {**{p: (p,) for p in PROJECTIONS}, **MEGATRON_LINEARS}
# the engine splits their input dimension; the rest their output (as megatron does: megarl.models.lora)
_ROW_PARALLEL = {name for name, p in LORA_PROJECTIONS.items() if p.row_parallel}
_PEFT_NAME = re.compile(r"\.(?P<projection>\w+)\.lora_(?P<part>[AB])\.weight$")
_WORKER_STATE = "_megarl_adapter"  # the worker attribute holding the installed adapter


def engine_lora_kwargs(lora) -> dict:
    """`vllm.LLM`'s LoRA arguments for a role's `lora` settings (`rank`, `target_modules`,
    `exclude_modules`): one adapter slot, the smallest rank vLLM allows that holds `rank` (its buffers are
    zero-padded past the adapter's rank), and the projections to wrap where the targets name them."""
    from vllm.config.lora import MaxLoRARanks

    allowed = sorted(typing.get_args(MaxLoRARanks))
    fitting = [r for r in allowed if r >= lora.rank]
    if not fitting:
        raise ValueError(
            f"actor.lora.rank={lora.rank} is above the largest rank vLLM serves ({allowed[-1]}); use a "
            f"rank <= {allowed[-1]} or actor.lora.sync=merged"
        )
    return dict(
        enable_lora=True,
        max_lora_rank=fitting[0],
        max_loras=1,
        max_cpu_loras=1,
        lora_target_modules=engine_target_modules(lora.target_modules, getattr(lora, "exclude_modules", ())),
    )


def engine_target_modules(targets, excluded=()) -> list[str] | None:
    """The Hugging Face projections the engine wraps with LoRA layers, or None (every linear it can) where
    `targets` holds "all-linear" or a pattern over module names: projections outside the adapter then
    carry zeros, which add exactly nothing."""
    targets = [targets] if isinstance(targets, str) else list(targets)
    if any(t not in _HF_LINEARS for t in targets):
        return None
    dropped = {p for e in excluded if e in _HF_LINEARS for p in _HF_LINEARS[e]}
    return sorted({p for t in targets for p in _HF_LINEARS[t]} - dropped)


def adapter_request():
    """The `LoRARequest` every request carries once an adapter is installed."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(ADAPTER_NAME, ADAPTER_ID, _ADAPTER_PATH)


def install_adapter(worker, tensors: dict[str, torch.Tensor], peft_config: dict) -> dict:
    """On the engine's worker: make `tensors` (PEFT names → full-shaped [r, in] / [out, r] tensors; a TP
    rank reads only its `engine_region`) with `peft_config` (adapter_config.json's fields: r, lora_alpha,
    target_modules) the adapter `ADAPTER_ID`. Copies the tensors (vLLM scales B in place). Returns seconds
    per phase."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.utils import parse_fine_tuned_lora_name

    manager = worker.model_runner.lora_manager
    engine = manager._adapter_manager
    helper = PEFTHelper.from_dict(
        {**peft_config, "vllm_max_position_embeddings": manager.max_position_embeddings}
    )
    helper.validate_legal(manager.lora_config)
    model = engine.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    mapper = mapper.get_rename_mapper() if mapper is not None else None
    modules = {}  # PEFT name → (engine module, slice of it)
    slices = {
        sub: (parent, i) for parent, subs in engine.packed_modules.items() for i, sub in enumerate(subs)
    }
    for name, tensor in tensors.items():
        module, _ = parse_fine_tuned_lora_name(name, mapper)
        place = (module, 0) if module in engine.modules else slices.get(module)
        if place is None:
            raise ValueError(
                f"adapter tensor {name}: the engine has no LoRA layer for {module} (its LoRA layers: "
                f"{sorted(engine.modules)[:4]}…); is the projection among actor.lora.target_modules?"
            )
        part_rank = tensor.shape[0] if ".lora_A." in name else tensor.shape[1]
        if part_rank != helper.r:
            raise ValueError(
                f"adapter tensor {name} has shape {tuple(tensor.shape)}; its rank is not r={helper.r}"
            )
        modules[name] = place
    start = time.perf_counter()
    dtype = manager.lora_config.lora_dtype
    own = {name: t.detach().to(device=engine.device, dtype=dtype, copy=True) for name, t in tensors.items()}
    lora = LoRAModel.from_lora_tensors(
        ADAPTER_ID,
        own,
        helper,
        device=str(engine.device),
        dtype=dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=mapper,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    built = time.perf_counter()
    engine.remove_adapter(ADAPTER_ID)
    engine.add_adapter(lora)
    engine.activate_adapter(ADAPTER_ID)
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    setattr(worker, _WORKER_STATE, (lora, modules, helper.vllm_lora_scaling_factor))
    return {"build_s": built - start, "activate_s": time.perf_counter() - built}


def reinstall_adapter(worker) -> bool:
    """On the engine's worker: put the installed adapter back after vLLM dropped it (its `reload_weights`
    removes every adapter). False where none was installed."""
    state = getattr(worker, _WORKER_STATE, None)
    if state is None:
        return False
    engine = worker.model_runner.lora_manager._adapter_manager
    engine.remove_adapter(ADAPTER_ID)
    engine.add_adapter(state[0])
    engine.activate_adapter(ADAPTER_ID)
    return True


def installed_adapter_checksums(worker) -> dict[str, float]:
    """On the engine's worker: `checksum` of what each installed PEFT tensor left in the adapter's slot of
    the engine's LoRA layers, B with the scaling taken out: this rank's `engine_region` of it."""
    state = getattr(worker, _WORKER_STATE, None)
    if state is None:
        return {}
    lora, modules, scaling = state
    engine = worker.model_runner.lora_manager._adapter_manager
    slot = engine.lora_index_to_id.index(ADAPTER_ID)
    sums = {}
    for name, (module, i) in modules.items():
        layer = engine.modules[module]
        if ".lora_A." in name:
            held = layer.lora_a_stacked[i][slot, 0, : lora.rank, :]
        else:
            held = layer.lora_b_stacked[i][slot, 0, :, : lora.rank].double() / scaling
        sums[name] = checksum(held)
    return sums


def checksum(tensor: torch.Tensor) -> float:
    """A position-weighted sum (fp64): differs for a transposed, shifted or swapped block, not only for
    changed values."""
    flat = tensor.detach().reshape(-1).to(torch.float64)
    weights = torch.arange(flat.numel(), dtype=torch.float64, device=flat.device) % 7 + 1
    return float((flat * weights).sum())


def engine_region(
    name: str, shape: tuple[int, int], tp: int, tp_rank: int, num_kv_heads: int
) -> tuple[slice, slice]:
    """The rows and columns of the full PEFT tensor `name` (shape `shape`: A [r, in], B [out, r]) that
    engine TP rank `tp_rank` of `tp` reads (vLLM 0.32, fully_sharded_loras off, as `engine_lora_kwargs`
    leaves it). Column projections (q, k, v, gate, up): A whole, B its block of output rows; k and v by
    KV head, each of min(tp, num_kv_heads) blocks shared by tp / that many ranks. Row projections (o,
    down): A its block of input columns, B whole."""
    match = _PEFT_NAME.search(name)
    if match is None:
        raise ValueError(f"{name} is not a PEFT LoRA tensor name (…<projection>.lora_A.weight / lora_B)")
    projection, part = match["projection"], match["part"]
    rows, cols = shape
    if projection in _ROW_PARALLEL:
        return slice(0, rows), (_block(cols, tp, tp_rank) if part == "A" else slice(0, cols))
    if part == "A":
        return slice(0, rows), slice(0, cols)
    if projection in ("k_proj", "v_proj"):
        blocks = min(tp, num_kv_heads)
        return _block(rows, blocks, tp_rank // (tp // blocks)), slice(0, cols)
    return _block(rows, tp, tp_rank), slice(0, cols)


def region_checksums(
    tensors: dict[str, torch.Tensor], tp: int, tp_rank: int, num_kv_heads: int
) -> dict[str, float]:
    """What `installed_adapter_checksums` reports on engine TP rank `tp_rank` after installing `tensors`
    (full-shaped, PEFT names): the trainer side of the debug comparison (actor.lora.check_sync)."""
    return {
        name: checksum(t[engine_region(name, tuple(t.shape), tp, tp_rank, num_kv_heads)])
        for name, t in tensors.items()
    }


def _block(size: int, blocks: int, index: int) -> slice:
    step = size // blocks
    return slice(index * step, (index + 1) * step)
