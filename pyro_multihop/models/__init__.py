"""Multi-hop attention heads: the exact chained head and the tied-embedding variant."""

from .base import HopAttentionHead
from .chained import ChainedAttention, onehot_gate_logits

__all__ = ["HopAttentionHead", "ChainedAttention", "onehot_gate_logits"]
