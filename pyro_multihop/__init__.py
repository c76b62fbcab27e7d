"""pyro-multihop: chained (multi-hop) responsibility attention as a probabilistic model, in Pyro.

Names are imported on first use (PEP 562 ``__getattr__``), so that ``import pyro_multihop`` and the command's
``--help`` do not load torch and Pyro until something needs them.
"""

from __future__ import annotations

import importlib
import warnings

__version__ = "0.1.0"

#: Public name -> the module (relative to this package) that defines it.
_EXPORTS = {
    "Observations": ".data",
    "DataError": ".data",
    "chain_task": ".data",
    "transitive_task": ".data",
    "induction_task": ".data",
    "FactObservations": ".data",
    "fact_chain_task": ".data",
    "fact_chain_vocabulary": ".data",
    "HopChain": ".engine",
    "HopPosterior": ".engine",
    "HopFactors": ".engine",
    "CollapsedHopChain": ".distributions",
    "get_memory_budget": ".engine",
    "set_memory_budget": ".engine",
    "memory_budget": ".engine",
    "HopAttentionHead": ".models",
    "KeyValueAttentionHead": ".models",
    "ChainedAttention": ".models",
    "FactAttention": ".models",
    "fact_chain_truth": ".models",
    "TiedEmbeddingAttention": ".models",
    "SymbolEmbeddings": ".embeddings",
    "TiedEmbeddingVEM": ".em",
    "ChainedEM": ".em",
    "ConvergenceWarning": ".em",
    "EMResult": ".em",
    "SufficientStats": ".em",
    "fit_svi": ".train",
    "fit_svi_starts": ".train",
    "SVI_DEFAULTS": ".train",
    "TrainingInterrupted": ".train",
    "OverfittingWarning": ".train",
    "save_checkpoint": ".checkpoint",
    "load_checkpoint": ".checkpoint",
    "CheckpointError": ".checkpoint",
    "prepare_run_dir": ".runs",
    "diagnose_fit": ".diagnostics",
    "DiagnosticWarning": ".diagnostics",
    "TrainingStuckWarning": ".diagnostics",
}

#: Renamed public names, kept for one release: old name -> (module, new name); reading one warns.
_DEPRECATED = {
    "HopGates": (".engine", "HopFactors"),
}

#: Sub-modules available as attributes (``pyro_multihop.engine``, ``pyro_multihop.datasets``).
_SUBMODULES = ("engine", "datasets")

__all__ = list(_EXPORTS) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _DEPRECATED:
        module, new_name = _DEPRECATED[name]
        warnings.warn(f"{__name__}.{name} is deprecated; use {__name__}.{new_name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(module, __name__), new_name)  # not cached: every read warns
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
