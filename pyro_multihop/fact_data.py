"""Deprecated: the fact-observation names moved to :mod:`pyro_multihop.data`.

``from pyro_multihop.fact_data import FactObservations`` still works for one release and warns
(``DeprecationWarning``); import from ``pyro_multihop.data`` instead.
"""

from __future__ import annotations

import importlib
import warnings

#: Name -> the module of :mod:`pyro_multihop.data` that now defines it.
_MOVED = {
    "FactObservations": "fact_observations",
    "FILE_FORMAT": "fact_observations",
    "FactChainVocabulary": "simulators",
    "fact_chain_vocabulary": "simulators",
    "fact_chain_task": "simulators",
}

__all__ = list(_MOVED)


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"pyro_multihop.fact_data is deprecated: import {name} from pyro_multihop.data "
        f"(defined in pyro_multihop.data.{_MOVED[name]})",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"pyro_multihop.data.{_MOVED[name]}"), name)


def __dir__():
    return sorted(set(globals()) | set(__all__))
