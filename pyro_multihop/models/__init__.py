"""Multi-hop attention heads: the exact chained head and the tied-embedding variant."""

from ..engine.moved_names import deprecated_aliases
from .base import HopAttentionHead, KeyValueAttentionHead
from .chained import ChainedAttention, onehot_gate_logits
from .facts import FactAttention
from .fact_truth import fact_chain_truth
from .tied import (
    TiedEmbeddingAttention,
    embedding_gate_logits,
    embedding_hop_factors,
    embedding_score_tables,
    squared_distances,
)

__all__ = [
    "HopAttentionHead",
    "KeyValueAttentionHead",
    "ChainedAttention",
    "FactAttention",
    "fact_chain_truth",
    "onehot_gate_logits",
    "TiedEmbeddingAttention",
    "embedding_gate_logits",
    "embedding_score_tables",
    "embedding_hop_factors",
    "squared_distances",
]

# Renamed with HopGates -> HopFactors; the old name is kept for one release.
__getattr__ = deprecated_aliases(__name__, {"embedding_hop_gates": (f"{__name__}.tied", "embedding_hop_factors")})
