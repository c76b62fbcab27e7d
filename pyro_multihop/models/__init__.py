"""Multi-hop attention heads: the exact chained head and the tied-embedding variant."""

from .base import HopAttentionHead
from .chained import ChainedAttention, onehot_gate_logits
from .facts import FactAttention, fact_chain_truth
from .tied import TiedEmbeddingAttention, embedding_gate_logits, embedding_hop_gates, embedding_score_tables, squared_distances

__all__ = [
    "HopAttentionHead",
    "ChainedAttention",
    "FactAttention",
    "fact_chain_truth",
    "onehot_gate_logits",
    "TiedEmbeddingAttention",
    "embedding_gate_logits",
    "embedding_score_tables",
    "embedding_hop_gates",
    "squared_distances",
]
