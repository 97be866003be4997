"""Weight pushes into a CPU vLLM engine of one TP rank, straight into its layers.

vLLM's CPU backend packs each linear layer's weight into a oneDNN GEMM handle and drops the plain
tensor, so a push must rebuild the handle. `reload_weights` does that through its general layer-wise
machinery (meta tensors, wrapped loaders, one signature bind per tensor): at the tiny model ~70% of a
27 ms transition (torch.profiler, one step of `megarl bench e2e`), the oneDNN repacking the rest. With
one engine TP rank the engine's fused layers are plain concatenations of the HF tensors (qkv_proj =
[q; k; v], gate_up_proj = [gate; up]), so the push can hand each layer its new weight and run the
layer's own post-load processing — exactly the step `reload_weights` ends with — and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Weights = Sequence[tuple[str, torch.Tensor]]


def load_into_layers(worker, weights: Weights) -> bool:
    """Load `weights` (HF names, whole layers) into `worker`'s model. Returns False, having changed
    nothing, where a tensor has no plain destination (a name or shape it does not know): the caller
    then falls back to `reload_weights`."""
    model = worker.model_runner.model
    plan = _plan(model, getattr(model, "packed_modules_mapping", {}), weights)
    if plan is None:
        return False
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    touched = {}
    for module, name, tensor in plan:
        param = module._parameters[name]
        if param.numel() == 0:  # a packed linear weight: the processing below packs this one
            module._parameters[name] = torch.nn.Parameter(tensor, requires_grad=False)
        elif param.shape == tensor.shape:
            param.data.copy_(tensor)
        else:  # a vocab-padded embedding or LM head: its loader pads
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
        touched[id(module)] = module
    for module in touched.values():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)
    return True


def _plan(model, packed: dict[str, list[str]], weights: Weights):
    """[(engine module, parameter name, tensor to load)], or None where the push needs vLLM's loader."""
    part_of = {part: (fused, i) for fused, parts in packed.items() for i, part in enumerate(parts)}
    modules = dict(model.named_modules())
    groups: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for hf_name, tensor in weights:
        path, _, name = hf_name.rpartition(".")
        parent, _, leaf = path.rpartition(".")
        fused, index = part_of.get(leaf, (leaf, 0))
        groups.setdefault((f"{parent}.{fused}" if parent else fused, name), {})[index] = tensor
    plan = []
    for (path, name), parts in groups.items():
        module = modules.get(path)
        param = None if module is None else module._parameters.get(name)
        count = len(packed.get(path.rpartition(".")[2], [path]))
        if param is None or sorted(parts) != list(range(count)):
            return None
        tensor = torch.cat([parts[i] for i in range(count)]) if count > 1 else parts[0]
        if param.numel() == 0:
            if name != "weight" or not hasattr(module, "cpu_linear"):
                return None
            shape = (module.output_size_per_partition, module.input_size_per_partition)
            if tuple(tensor.shape) != shape or tensor.dtype != param.dtype:
                return None
            # the GEMM handle is built from this tensor: never the caller's (maybe training) storage
            tensor = tensor.clone() if count == 1 else tensor
        elif param.shape != tensor.shape and not (count == 1 and _padded_rows(param, tensor)):
            return None
        plan.append((module, name, tensor.detach()))
    return plan


def _padded_rows(param: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether `param` is `tensor` with rows added (vLLM pads the vocabulary of embeddings and heads)."""
    return (
        param.dim() == tensor.dim() == 2
        and param.shape[1] == tensor.shape[1]
        and param.shape[0] > tensor.shape[0]
    )
