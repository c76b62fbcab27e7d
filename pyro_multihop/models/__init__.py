"""Multi-hop attention heads: the exact chained head and the tied-embedding variant."""

from .base import HopAttentionHead
from .chained import ChainedAttention, onehot_gate_logits
from .tied import TiedEmbeddingAttention, embedding_gate_chain, embedding_gate_logits, squared_distances

__all__ = [
    "HopAttentionHead",
    "ChainedAttention",
    "onehot_gate_logits",
    "TiedEmbeddingAttention",
    "embedding_gate_logits",
    "embedding_gate_chain",
    "squared_distances",
]
