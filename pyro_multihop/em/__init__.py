"""EM references for the multi-hop heads.

- :mod:`pyro_multihop.em.closed_form`: closed-form EM for the one-hot :class:`~pyro_multihop.models.ChainedAttention`
  (exact forward-backward E-step, additive sufficient statistics, closed-form M-step).
- :mod:`pyro_multihop.em.variational`: the variational-EM reference for the tied-embedding head
  (Monte-Carlo reparameterised ELBO gradient with Adam, closed-form emission, prior annealing).
- :mod:`pyro_multihop.em.em_runs`: EM runs as ``pyro-multihop train --method em`` makes them (metrics frames,
  the checkpoint schema, notes).
"""

from .closed_form import ChainedEM, ConvergenceWarning, EMResult, SufficientStats
from .variational import TiedEmbeddingVEM

__all__ = [
    "ChainedEM",
    "ConvergenceWarning",
    "EMResult",
    "SufficientStats",
    "TiedEmbeddingVEM",
]
