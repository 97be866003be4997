"""Load megatron dist-checkpoints without running code from the files: `no_code_unpickling()`.

What megatron-core 0.16.1 + torch 2.13 unpickle while loading a torch_dist checkpoint:
  common.pt and ShardedObject `*.pt`   `torch.load(path)` without weights_only: True by torch's default,
                                       unless TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 is set
  ShardedObjects stored inside DCP     `torch.load(bytes, weights_only=False)` (DefaultLoadPlanner.load_bytes)
  `.metadata` (torch DCP)              plain `pickle.load` (FileSystemReader.read_metadata): arbitrary code
Inside the context every torch.load is forced to weights_only (TORCH_FORCE_WEIGHTS_ONLY_LOAD overrides
even an explicit weights_only=False), and DCP's metadata is read by an unpickler that only builds DCP's
own metadata classes, torch sizes/dtypes and builtin containers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import os
import pickle
import types
from collections.abc import Iterator

import torch

# torch.serialization._get_layout maps a layout's name to the torch.layout (weights_only allows it too).
_BUILTINS = {
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("pathlib", "PosixPath"),  # DCP's storage_meta.checkpoint_id when the writer was given a Path
    ("pathlib", "PurePosixPath"),
}
_DATA_MODULES = ("torch.distributed.checkpoint.", "megatron.core.dist_checkpointing.")


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _BUILTINS:
            return super().find_class(module, name)
        if module == "torch":
            obj = getattr(torch, name, None)
            if name == "Size" or isinstance(obj, torch.dtype | torch.layout | torch.memory_format):
                return obj
        if module.startswith(_DATA_MODULES):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name} from checkpoint metadata (only DCP metadata classes are allowed)"
        )


def _restricted_pickle() -> types.SimpleNamespace:
    def load(file, **kwargs):
        return _MetadataUnpickler(file, **kwargs).load()

    return types.SimpleNamespace(load=load, loads=None, dump=pickle.dump, dumps=pickle.dumps)


@contextlib.contextmanager
def no_code_unpickling() -> Iterator[None]:
    """Within: torch.load is weights_only everywhere and DCP metadata is unpickled with an allowlist."""
    from torch.distributed.checkpoint import filesystem

    saved_env = {
        k: os.environ.get(k) for k in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    }
    saved_pickle = filesystem.pickle
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    os.environ.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # both set is an error in torch.load
    filesystem.pickle = _restricted_pickle()
    try:
        yield
    finally:
        filesystem.pickle = saved_pickle
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
