"""Weight pushes into a CPU vLLM engine of one TP rank, straight into its layers.

vLLM's CPU backend packs each linear layer's weight into a oneDNN GEMM handle and drops the plain
tensor, so a push must rebuild the handle. `reload_weights` does that through its general layer-wise
machinery (meta tensors, wrapped loaders, one signature bind per tensor): at the tiny model ~70% of a
27 ms transition (torch.profiler, one step of `megarl bench e2e`), the oneDNN repacking the rest. For
the model types megarl converts (`megarl.models.from_hf.FAMILIES`), unquantized and with one engine TP
rank, vLLM's loader changes no tensor: its fused layers are concatenations of the HF tensors in
`packed_modules_mapping` order (qkv_proj = [q; k; v], gate_up_proj = [gate; up]) and the vocabulary is
zero-padded. So the push hands each layer its new tensors and runs the layer's own post-load processing
— the step `reload_weights` ends with — and nothing else. Anything else goes to `reload_weights`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from megarl.models.from_hf import FAMILIES

Weights = Sequence[tuple[str, torch.Tensor]]
Plan = list[tuple[torch.nn.Module, str, torch.Tensor]]


def load_into_layers(worker, weights: Weights) -> bool:
    """Load `weights` (HF names, whole layers, detached) into `worker`'s model. Returns False, having changed
    nothing, where the model or a tensor is not one this path knows: the caller then uses
    `reload_weights`."""
    config = worker.model_runner.model_config
    if config.quantization is not None or config.hf_config.model_type not in FAMILIES:
        return False
    model = worker.model_runner.model
    plan = _plan(model, getattr(model, "packed_modules_mapping", {}), weights)
    if plan is None:
        return False
    _apply(plan)
    return True


def _plan(model: torch.nn.Module, packed: dict[str, list[str]], weights: Weights) -> Plan | None:
    """[(engine module, parameter name, tensor to load)], or None where the push needs vLLM's loader."""
    from vllm.lora.layers import BaseLayerWithLoRA
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    part_of = {part: (fused, i) for fused, parts in packed.items() for i, part in enumerate(parts)}
    modules = dict(model.named_modules())
    groups: dict[tuple[str, str, int], dict[int, torch.Tensor]] = {}  # (module, param, parts): tensors
    for hf_name, tensor in weights:
        path, _, name = hf_name.rpartition(".")
        parent, _, leaf = path.rpartition(".")
        fused, index = part_of.get(leaf, (leaf, 0))
        count = len(packed.get(fused, ())) or 1
        groups.setdefault((f"{parent}.{fused}" if parent else fused, name, count), {})[index] = tensor
    plan = []
    for (path, name, count), parts in groups.items():
        module = modules.get(path)
        if isinstance(module, BaseLayerWithLoRA):  # LoRA enabled: the layer it wraps takes the weights
            module = module.base_layer
        param = None if module is None else module._parameters.get(name)
        method = getattr(module, "quant_method", None)
        if param is None or sorted(parts) != list(range(count)):
            return None
        if method is not None and not isinstance(
            method, UnquantizedLinearMethod | UnquantizedEmbeddingMethod
        ):
            return None
        # a fresh contiguous tensor: a packed layer's GEMM handle is built from it, never the caller's
        tensor = torch.cat([parts[i] for i in range(count)]) if count > 1 else parts[0]
        tensor = tensor.to(param.dtype, memory_format=torch.contiguous_format, copy=count == 1)
        if param.numel() == 0:  # the linear weight vLLM packed away
            shape = (
                getattr(module, "output_size_per_partition", 0),
                getattr(module, "input_size_per_partition", 0),
            )
            if name != "weight" or not isinstance(method, UnquantizedLinearMethod) or tensor.shape != shape:
                return None
        elif param.shape != tensor.shape and not _vocab_padded(module, param, tensor):
            return None
        plan.append((module, name, tensor))
    return plan


def _vocab_padded(module: torch.nn.Module, param: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether `param` is the vocabulary `tensor` plus vLLM's padding rows (an embedding or LM head)."""
    return (
        getattr(module, "org_vocab_size", None) == tensor.shape[0]
        and getattr(module, "num_added_embeddings", 0) == 0
        and param.shape[1:] == tensor.shape[1:]
        and param.shape[0] > tensor.shape[0]
    )


def _apply(plan: Plan) -> None:
    """Put each tensor in place, then redo each touched layer's post-load processing once."""
    touched = {}
    for module, name, tensor in plan:
        param = module._parameters[name]
        if param.numel() == 0:
            module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)
        else:
            rows = tensor.shape[0]
            param.data[:rows].copy_(tensor)
            param.data[rows:].zero_()  # vocabulary padding (empty otherwise), as vLLM's loader leaves it
        touched[id(module)] = module
    for module in touched.values():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
