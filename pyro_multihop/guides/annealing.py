"""KL annealing: schedules of the weight on the KL term of the ELBO, and the handler that applies it.

A variational head with a global continuous latent (the tied embeddings) maximises the annealed ELBO::

    ELBO_w = E_q[log p(targets | embeddings)] - w * KL(q(embeddings) || p(embeddings))

The schedule gives ``w`` for each SVI step; :func:`scale_kl` applies it, in the model to the prior site
and in the guide to the posterior site, so that exactly ``w * (log p(e) - log q(e))`` (whose expectation
under ``q`` is ``-w * KL``) enters the loss and nothing else is touched. This is the KL annealing of
pyro's ``examples/dmm.py``. Enumerated hop sites are never scaled: ``TraceEnum_ELBO`` needs one common
scale across every enumerated site and the sites that depend on them.

``poutine.scale`` refuses a zero scale, so a weight of exactly 0 is applied as ``poutine.mask(mask=False)``
(the site's log-density counts as 0): the same thing, as the limit ``w -> 0``.

Example::

    >>> from pyro_multihop.guides import LinearAnnealing
    >>> schedule = LinearAnnealing(prior_strength=0.1, anneal_steps=100)
    >>> schedule(0), schedule(49), schedule(99), schedule(500)
    (0.001, 0.05, 0.1, 0.1)
    >>> LinearAnnealing()(99)                     # the default final weight, DEFAULT_PRIOR_STRENGTH
    0.01
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from pyro import poutine

from ..checks import check_number

__all__ = ["DEFAULT_PRIOR_STRENGTH", "AnnealingSchedule", "LinearAnnealing", "Constant", "make_schedule", "scale_kl",
           "check_kl_weight"]

#: Final KL weight of the default schedule (SVI and variational EM). The specification's reference uses
#: 0.1; on a task that needs only identity matching (the tied head matches a symbol with itself for free)
#: the posterior noise separates the symbols as well as the means do, and at weight 0.1 the KL pulls the
#: means together (mean pairwise distance 0.8 to 1.5, plug-in accuracy 0.64 to 0.84 on the distractor
#: task of ``benchmarks/tied_defaults.py``); at 0.01 they stay apart, and the transitive task is unchanged.
DEFAULT_PRIOR_STRENGTH = 0.01


def check_kl_weight(kl_weight) -> float:
    """``kl_weight`` as a float; ``ValueError`` naming it unless it is finite and ``>= 0``.

    Accepts a Python number or a one-element tensor.
    """
    if hasattr(kl_weight, "numel"):
        if kl_weight.numel() != 1:
            raise ValueError(f"kl_weight must be a scalar, got a tensor of shape {tuple(kl_weight.shape)}")
        kl_weight = kl_weight.item()
    return check_number("kl_weight", kl_weight)


def scale_kl(kl_weight):
    """Context handler multiplying the log-densities of the sites inside it by ``kl_weight >= 0``.

    Wrap the global continuous latent site, in the model and in the guide alike, and nothing else::

        with scale_kl(kl_weight):
            embeddings = pyro.sample("embeddings", prior)   # model; the guide does the same with q

    :param kl_weight: a number or a scalar tensor, finite and ``>= 0``.
    :returns: ``poutine.scale(scale=kl_weight)``, or ``poutine.mask(mask=False)`` for a weight of 0.
        A tensor weight stays a tensor (so that a traced ELBO, ``JitTraceEnum_ELBO``, follows its value
        from step to step) and is floored at the smallest normal float, 1e-38 in float32, since
        ``poutine.scale`` refuses 0: the log-density it multiplies is then 0 to every printed digit.
    """
    weight = check_kl_weight(kl_weight)
    if isinstance(kl_weight, torch.Tensor):
        return poutine.scale(scale=kl_weight.reshape(()).clamp_min(torch.finfo(kl_weight.dtype).tiny))
    if weight == 0.0:
        return poutine.mask(mask=False)
    return poutine.scale(scale=weight)


class AnnealingSchedule:
    """Base class: a callable ``step -> weight`` (a float ``>= 0``), with a JSON-serialisable :meth:`config`."""

    name: str = ""

    def __call__(self, step: int) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def config(self) -> dict:  # pragma: no cover - abstract
        """``{"name": ..., **constructor arguments}``; :func:`make_schedule` rebuilds the schedule from it."""
        raise NotImplementedError

    @staticmethod
    def _check_step(step) -> int:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative integer, got {step!r}")
        return step

    def __eq__(self, other) -> bool:
        return isinstance(other, AnnealingSchedule) and self.config() == other.config()

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")
        return f"{type(self).__name__}({arguments})"


class LinearAnnealing(AnnealingSchedule):
    """KL weight ramping linearly from ``start`` at step 0 to ``prior_strength`` at step ``anneal_steps - 1``,
    then constant::

        w(t) = start + (prior_strength - start) * min(t, A - 1) / (A - 1)        (A = anneal_steps >= 2)

    With the default ``start = prior_strength / anneal_steps`` this is ``prior_strength * min(1, (t + 1) / A)``,
    the reference estimator's ramp: the weight starts at about 0, so the data spreads the embeddings
    before the prior can pull them together. ``anneal_steps`` of 0 or 1 gives ``prior_strength`` from step 0
    (no annealing).

    :param float prior_strength: final weight of the KL term, ``>= 0``; default :data:`DEFAULT_PRIOR_STRENGTH`
        (0.01; the specification's reference uses 0.1, see ``docs/tied.md`` for the measurement).
    :param int anneal_steps: length of the ramp in SVI steps (or EM iterations), ``>= 0``.
    :param start: weight at step 0, in ``[0, prior_strength]``; default ``prior_strength / anneal_steps``.
    """

    name = "linear"

    def __init__(self, prior_strength: float = DEFAULT_PRIOR_STRENGTH, anneal_steps: int = 100,
                 start: Optional[float] = None):
        self.prior_strength = check_number("prior_strength", prior_strength)
        if isinstance(anneal_steps, bool) or not isinstance(anneal_steps, int) or anneal_steps < 0:
            raise ValueError(f"anneal_steps must be a non-negative integer, got {anneal_steps!r}")
        self.anneal_steps = anneal_steps
        if start is None:
            start = self.prior_strength / max(anneal_steps, 1)
        self.start = check_number("start", start)
        if self.start > self.prior_strength:
            raise ValueError(f"start must be <= prior_strength = {self.prior_strength}, got {start!r}")

    def __call__(self, step: int) -> float:
        step = self._check_step(step)
        if self.anneal_steps <= 1 or step >= self.anneal_steps - 1:
            return self.prior_strength
        fraction = step / (self.anneal_steps - 1)
        return self.start + (self.prior_strength - self.start) * fraction

    def config(self) -> dict:
        return {
            "name": self.name,
            "prior_strength": self.prior_strength,
            "anneal_steps": self.anneal_steps,
            "start": self.start,
        }


class Constant(AnnealingSchedule):
    """The same KL weight at every step (no annealing); ``Constant(1.0)`` is the plain ELBO.

    :param float weight: ``>= 0``.
    """

    name = "constant"

    def __init__(self, weight: float = 1.0):
        self.weight = check_number("weight", weight)

    def __call__(self, step: int) -> float:
        self._check_step(step)
        return self.weight

    def config(self) -> dict:
        return {"name": self.name, "weight": self.weight}


_SCHEDULES = {cls.name: cls for cls in (LinearAnnealing, Constant)}


def make_schedule(spec: Union[None, AnnealingSchedule, dict]) -> AnnealingSchedule:
    """A schedule from ``None`` (the default ``LinearAnnealing()``), a schedule, or a :meth:`config` dict."""
    if spec is None:
        return LinearAnnealing()
    if isinstance(spec, AnnealingSchedule):
        return spec
    if isinstance(spec, dict):
        arguments = dict(spec)
        name = arguments.pop("name", None)
        if name not in _SCHEDULES:
            raise ValueError(f"annealing name must be one of {sorted(_SCHEDULES)}, got {name!r}")
        return _SCHEDULES[name](**arguments)
    raise TypeError(f"annealing must be an AnnealingSchedule, a config dict or None, got {type(spec).__name__}")
