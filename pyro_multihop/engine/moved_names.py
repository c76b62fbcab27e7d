"""Deprecated aliases of the engine's names that moved to another module or were renamed: a module-level
``__getattr__`` (PEP 562) that warns once per read and imports the new home on first use (so that an old
module need not import the module that now imports it)."""

from __future__ import annotations

import importlib
import warnings
from typing import Callable, Dict, Tuple

__all__ = ["deprecated_aliases"]


def deprecated_aliases(module: str, moved: Dict[str, Tuple[str, str]]) -> Callable[[str], object]:
    """A ``__getattr__`` for ``module``: ``moved`` maps each old name to ``(new module, new name)``; reading an
    old name warns (:class:`DeprecationWarning`, naming the new one) and returns the new object."""

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new_module, new_name = moved[name]
        warnings.warn(f"{module}.{name} is deprecated; use {new_module}.{new_name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__
