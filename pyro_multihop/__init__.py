"""pyro-multihop: chained (multi-hop) responsibility attention as a probabilistic model, in Pyro."""

from . import engine
from .data import DataError, Observations, chain_task, induction_task, transitive_task
from .fact_data import FactObservations, fact_chain_task, fact_chain_vocabulary
from .em import ChainedEM, ConvergenceWarning, EMResult, SufficientStats
from .distributions import CollapsedHopChain
from .engine import HopGates, get_memory_budget, memory_budget, set_memory_budget
from .hop_chain import HopChain, HopPosterior
from .em import TiedEmbeddingVEM
from .models import ChainedAttention, HopAttentionHead, TiedEmbeddingAttention
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .train import SVI_DEFAULTS, TrainingInterrupted, fit_svi
from . import datasets

__version__ = "0.1.0"

__all__ = [
    "Observations",
    "DataError",
    "chain_task",
    "transitive_task",
    "induction_task",
    "FactObservations",
    "fact_chain_task",
    "fact_chain_vocabulary",
    "HopChain",
    "HopPosterior",
    "engine",
    "HopGates",
    "CollapsedHopChain",
    "get_memory_budget",
    "set_memory_budget",
    "memory_budget",
    "HopAttentionHead",
    "ChainedAttention",
    "TiedEmbeddingAttention",
    "TiedEmbeddingVEM",
    "ChainedEM",
    "ConvergenceWarning",
    "EMResult",
    "SufficientStats",
    "fit_svi",
    "SVI_DEFAULTS",
    "TrainingInterrupted",
    "save_checkpoint",
    "load_checkpoint",
    "datasets",
    "CheckpointError",
]
