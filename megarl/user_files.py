"""Importing a user's Python file (a reward function, a tool, an environment, an agent) as a module of its
own: named from a prefix and the file's path, registered in sys.modules (dataclasses and pickling look
modules up by name), removed again when the import fails."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from types import ModuleType


def import_file(path: str, prefix: str, reuse: bool = False) -> ModuleType | None:
    """The module of the Python file at `path`, or None when it cannot be loaded as Python. Whatever the
    file raises while being imported propagates, with nothing left in sys.modules. `reuse`: a file this
    process already imported under `prefix` is not imported again (its module state is kept)."""
    name = prefix + hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:12]
    if reuse and name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
