"""EM references for the multi-hop heads.

- :mod:`pyro_multihop.em.chained`: closed-form EM for the one-hot :class:`~pyro_multihop.models.ChainedAttention`
  (exact forward-backward E-step, additive sufficient statistics, closed-form M-step).
"""

from .chained import ChainedEM, ConvergenceWarning, EMResult, SufficientStats

# Variational EM for the tied-embedding head lives in ``pyro_multihop.em.variational`` (added separately);
# import and list its public names here, next to the chained ones.

__all__ = [
    "ChainedEM",
    "ConvergenceWarning",
    "EMResult",
    "SufficientStats",
]
