"""Deprecated aliases of the engine's names that moved to another module or were renamed: a module-level
``__getattr__`` (PEP 562) that warns once per read and imports the new home on first use (so that an old
module need not import the module that now imports it)."""

from __future__ import annotations

import importlib
import warnings
from typing import Callable, Dict, Sequence, Tuple

__all__ = ["deprecated_aliases"]


def deprecated_aliases(module: str, moved: Dict[str, Tuple[str, str]],
                       moved_modules: Sequence[str] = ()) -> Callable[[str], object]:
    """A ``__getattr__`` for ``module``: ``moved`` maps each old name to ``(new module, new name)``, and each of
    ``moved_modules`` takes its public names (its ``__all__``) under the same names (a module that moved out whole:
    its names need not be spelt here); reading an old name warns (:class:`DeprecationWarning`, naming the new one)
    and returns the new object."""

    def __getattr__(name: str):
        if name in moved:
            new_module, new_name = moved[name]
        else:  # dunders are the import system's probes, answered before the moved module may be imported
            new_module = None if name.startswith("__") else next((path for path in moved_modules
                                                                  if name in importlib.import_module(path).__all__), None)
            if new_module is None:
                raise AttributeError(f"module {module!r} has no attribute {name!r}")
            new_name = name
        warnings.warn(f"{module}.{name} is deprecated; use {new_module}.{new_name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__
