"""The one recursion over the hop chain; every query passes in its step (torch-struct's idea: one dynamic
program, many semirings).

A step maps the message of one hop to the next and may keep something for decoding (backpointers, the
scale of a rescaled message). The sum-product messages of the probability-space routes, the max-product
and k-max messages of the path queries, and the log-space messages of :mod:`.log_space` are all
:func:`recurse` with a different step; :func:`forward_messages` and :func:`backward_messages` are the two
sum-product passes over a transition operator (:class:`~pyro_multihop.engine.transitions.Transitions`).
"""

from __future__ import annotations

from typing import Callable, Iterable, List, Optional, Tuple

import torch

__all__ = ["Step", "recurse", "forward_messages", "backward_messages", "underflow_floor"]

#: ``step(message, hop) -> (next message, what the step keeps for decoding or None)``.
Step = Callable[[torch.Tensor, int], Tuple[torch.Tensor, Optional[torch.Tensor]]]


def recurse(first: torch.Tensor, hops: Iterable[int], step: Step) -> Tuple[List[torch.Tensor], list]:
    """``message_{k+1} = step(message_k, hops[k])``: the messages ``[first, ...]`` and what each step kept."""
    messages, kept = [first], []
    for hop in hops:
        message, keep = step(messages[-1], hop)
        messages.append(message)
        kept.append(keep)
    return messages, kept


def underflow_floor(dtype: torch.dtype) -> float:
    """Sums below this may hold imprecise subnormals; rows that reach it go to log space."""
    info = torch.finfo(dtype)
    return info.tiny / info.eps


def forward_messages(transitions, init: torch.Tensor, n_hops: int) -> List[torch.Tensor]:
    """Prior messages ``alpha[l] (c, N) = p(z_{l+1} = i)``, ``l = 0..L-1``: distributions, since the
    transitions are row-stochastic, so no rescaling is needed."""
    return recurse(init, range(n_hops - 1), lambda alpha, hop: (transitions.forward(alpha, hop), None))[0]


def backward_messages(transitions, emission: torch.Tensor, n_hops: int) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    """Backward messages ``beta[l] (c, N)``, proportional to ``p(target | z_{l+1} = i)``, each rescaled to a
    row maximum of 1 (``beta[L-1]`` is ``emission`` as given), and the scales ``(c,)`` divided out at hops
    ``0..L-2`` (a scale below :func:`underflow_floor` means the row underflowed)."""
    floor = underflow_floor(emission.dtype)

    def step(beta, hop):
        beta = transitions.backward(beta, hop)
        scale = beta.amax(-1, keepdim=True)
        return beta / scale.clamp_min(floor), scale.squeeze(-1)

    betas, scales = recurse(emission, reversed(range(n_hops - 1)), step)
    return betas[::-1], scales[::-1]
