"""Variational EM for the tied-embedding head: the reference algorithm, without Pyro.

Each iteration ``t`` (``w_t`` the annealed KL weight, ``q(e) = prod Normal(m, exp(log_var / 2))``)::

    E-step   draw eps^(1..mc) ~ Normal(0, I), e^(k) = m + exp(log_var / 2) * eps^(k)        (S, D) each
             ELBO_t = mean_k sum_obs log p(target | e^(k)) - w_t * KL(q || Normal(0, I))   (hops summed exactly)
             gamma[obs, i] = mean_k p(z_L = i | obs, e^(k))                               last-hop responsibilities
                                                 (their counts below: the ELBO's gradient in log emission)
             LL_t = sum_obs log p(target | plug-in table at m, exp(log_var / 2))         the head's plug-in rule
    M-step   (m, log_var) <- Adam step along grad ELBO_t (reparameterised, analytic KL)
             emission[v, t] <- (sum_{obs, i: value_i = v, target = t} gamma[obs, i] + alpha)
                               / (sum_{obs, i: value_i = v} gamma[obs, i] + T alpha)

with the weight ``w_t = prior_strength * min(1, (t + 1) / anneal_iters)``
(:class:`~pyro_multihop.guides.LinearAnnealing`). The initial emission comes from the smoothed counts of
random (uniform on the simplex) last-hop responsibilities. The KL weight multiplies the KL of the whole
data set's ELBO (the sum over observations), as in the Pyro model: ``TiedEmbeddingAttention`` with the
same schedule maximises the same objective by SVI, one draw a step.

Two quantities are recorded per iteration, each under its own name: ``elbos_``, the annealed ELBO per
observation (a Monte-Carlo estimate of ``E_q[log-likelihood] - w_t KL / n``), and ``log_likelihoods_``,
the plug-in log-likelihood per observation of the training data, which is what :meth:`TiedEmbeddingVEM.score`
and the head's ``evaluate`` report. The two can disagree: draws from a wide posterior can separate the
symbols while a plug-in predictor does not. Convergence needs both to settle, and
:func:`~pyro_multihop.diagnostics.diagnose_fit` runs at the end of :meth:`TiedEmbeddingVEM.fit`.

Example::

    >>> from pyro_multihop.data import transitive_task
    >>> from pyro_multihop.em.variational import TiedEmbeddingVEM
    >>> obs = transitive_task(200, num_symbols=18, pairs=3, seed=0)
    >>> vem = TiedEmbeddingVEM(18, 8, 18, max_iters=20).fit(obs)   # doctest: +SKIP
    >>> vem.predict_proba(obs).shape                                # doctest: +SKIP
    torch.Size([200, 18])
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Optional

import pandas as pd
import torch

from .. import distributed, engine
from ..checks import check_number, check_positive_int, check_sigma2
from ..data import Observations
from ..diagnostics import diagnose_fit
from ..guides.annealing import DEFAULT_PRIOR_STRENGTH, LinearAnnealing
from ..models.tied import PLUG_IN_RULES, TiedEmbeddingAttention, embedding_hop_factors, plug_in_hop_factors
from .closed_form import ConvergenceWarning

__all__ = ["TiedEmbeddingVEM"]

logger = logging.getLogger(__name__)


class TiedEmbeddingVEM:
    """Variational EM (Monte-Carlo reparameterised ELBO gradient + Adam for the embeddings, closed-form
    smoothed counts for the emission) for the L-hop tied-embedding model. See the module docstring.

    :param int num_symbols: ``S``. :param int embed_dim: ``D``. :param int num_targets: ``T``.
    :param int n_hops: ``L``.
    :param float sigma2: gate variance (0.3).
    :param float lr: Adam learning rate of the means and log variances (0.05).
    :param int mc: Monte-Carlo draws of the embeddings per iteration (5).
    :param float prior_strength: final KL weight (0.01, :data:`~pyro_multihop.guides.annealing.DEFAULT_PRIOR_STRENGTH`;
        ``docs/tied.md`` measures it against the reference's 0.1). :param int anneal_iters: length of its ramp (100).
    :param str plug_in: the plug-in rule of the fitted head and of ``log_likelihoods_`` (``"expected"``; see
        :mod:`pyro_multihop.models.tied`).
    :param float emission_smoothing: pseudo-count ``alpha`` of the emission M-step (1e-4).
    :param float init_loc_scale: standard deviation of the random initial means (0.1).
    :param float init_log_var: initial log variance of every entry (``2 log 0.1``, posterior sd 0.1).
    :param int max_iters: most iterations of :meth:`fit` (1000).
    :param float tol: convergence threshold (1e-4) on the change, per observation, of the mean over the last
        ``window`` iterations against the ``window`` before, met by both the annealed ELBO (the posterior has
        settled) and the plug-in training log-likelihood (so has the predictor). Both windows must lie after
        the KL ramp, so the earliest stop is at ``anneal_iters + 2 * window`` iterations.
    :param int window: that averaging window (50). The posterior variances move the fit slowly, so a short
        window or a loose ``tol`` stops while they are still growing.
    :param int seed: seed of the initial means, the initial responsibilities and the draws (0).

    Fitted attributes: ``means_``, ``log_vars_`` (``(S, D)``), ``scales_`` (``exp(log_vars_ / 2)``),
    ``emission_`` (``(S, T)``), ``n_iter_``, ``converged_``, and per iteration (before its update):
    ``elbos_`` (annealed ELBO per observation), ``log_likelihoods_`` (plug-in training log-likelihood per
    observation), ``lower_bounds_`` (annealed ELBO of the whole data, ``n * elbos_``) and ``kl_weights_``;
    :meth:`metrics` gathers them in a frame. ``diagnostics_`` lists the diagnostics the fit raised.
    """

    def __init__(
        self,
        num_symbols: int,
        embed_dim: int,
        num_targets: int,
        n_hops: int = 2,
        *,
        sigma2: float = 0.3,
        lr: float = 0.05,
        mc: int = 5,
        prior_strength: float = DEFAULT_PRIOR_STRENGTH,
        anneal_iters: int = 100,
        plug_in: str = "expected",
        emission_smoothing: float = 1e-4,
        init_loc_scale: float = 0.1,
        init_log_var: float = 2 * math.log(0.1),
        max_iters: int = 1000,
        tol: float = 1e-4,
        window: int = 50,
        seed: int = 0,
    ):
        self.num_symbols = num_symbols
        self.embed_dim = embed_dim
        self.num_targets = num_targets
        self.n_hops = n_hops
        self.sigma2 = sigma2
        self.lr = lr
        self.mc = mc
        self.prior_strength = prior_strength
        self.anneal_iters = anneal_iters
        self.plug_in = plug_in
        self.emission_smoothing = emission_smoothing
        self.init_loc_scale = init_loc_scale
        self.init_log_var = init_log_var
        self.max_iters = max_iters
        self.tol = tol
        self.window = window
        self.seed = seed

    # -- validation -----------------------------------------------------------------------------------
    def _check_settings(self) -> LinearAnnealing:
        for name in ("num_symbols", "embed_dim", "num_targets", "n_hops", "mc", "max_iters", "window"):
            check_positive_int(name, getattr(self, name))
        check_sigma2(self.sigma2)
        if self.plug_in not in PLUG_IN_RULES:
            raise ValueError(f"plug_in must be one of {PLUG_IN_RULES}, got {self.plug_in!r}")
        if isinstance(self.anneal_iters, bool) or not isinstance(self.anneal_iters, int) or self.anneal_iters < 0:
            raise ValueError(f"anneal_iters must be a non-negative integer, got {self.anneal_iters!r}")
        check_number("lr", self.lr, 0.0, strict=True)
        check_number("emission_smoothing", self.emission_smoothing, 0.0, strict=True)
        check_number("init_loc_scale", self.init_loc_scale, 0.0, strict=False)
        check_number("init_log_var", self.init_log_var, -math.inf, strict=True)
        check_number("tol", self.tol, 0.0, strict=False)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        return LinearAnnealing(self.prior_strength, self.anneal_iters)

    def _check_fitted(self) -> None:
        if not hasattr(self, "means_"):
            raise RuntimeError(f"this {type(self).__name__} is not fitted yet; call fit(obs) first")

    def _check_observations(self, obs: Observations, allow_empty: bool = False) -> Observations:
        if not isinstance(obs, Observations):
            raise TypeError(f"obs must be pyro_multihop.Observations, got {type(obs).__name__}")
        if len(obs) == 0 and not allow_empty:
            raise ValueError("obs must hold at least one observation, got 0")
        obs.check_sizes(self.num_symbols, self.num_targets)
        return obs

    # -- the algorithm --------------------------------------------------------------------------------
    def fit(self, obs: Observations, max_iters: Optional[int] = None) -> "TiedEmbeddingVEM":
        """Run variational EM on ``obs`` from a fresh initialisation; returns ``self``.

        Warns :class:`ConvergenceWarning` if it stops at ``max_iters`` before meeting ``tol``.

        Under a ``torch.distributed`` process group ``obs`` is this process's shard of the rows (possibly
        empty): the ELBO, its gradient and the emission counts are summed over the processes in one
        all-reduce per iteration, and every process draws the same embeddings, so every process fits the
        same model, that of the union of the shards.

        :param max_iters: overrides the constructor's ``max_iters`` for this call.
        """
        schedule = self._check_settings()
        with distributed.agreed():  # a bad shard ends every rank, not only its own
            self._check_observations(obs, allow_empty=distributed.is_distributed())
        n = int(distributed.all_reduce_sum(len(obs))[0])
        if n == 0:
            raise ValueError("obs must hold at least one observation, got 0")
        max_iters = self.max_iters if max_iters is None else check_positive_int("max_iters", max_iters)
        dtype = torch.get_default_dtype()
        generator = torch.Generator().manual_seed(self.seed)
        shape = (self.num_symbols, self.embed_dim)
        means = (self.init_loc_scale * torch.randn(shape, generator=generator, dtype=dtype)).requires_grad_()
        log_vars = torch.full(shape, float(self.init_log_var), dtype=dtype).requires_grad_()
        optimizer = torch.optim.Adam([means, log_vars], lr=self.lr)
        # The initial responsibilities are drawn per shard; the embedding draws stay alike on every rank.
        own = generator if not distributed.is_distributed() else torch.Generator().manual_seed(distributed.rank_seed(self.seed))
        emission = self._initial_emission(obs, own, dtype)

        elbos, log_likelihoods, kl_weights = [], [], []
        converged = False
        iteration = 0
        for iteration in range(1, max_iters + 1):
            weight = schedule(iteration - 1)
            elbo, log_emission = self._e_step(obs, means, log_vars, emission, weight, generator)
            optimizer.zero_grad()
            (-elbo).backward()
            counts = -log_emission.grad  # the responsibility-weighted counts (see _e_step)
            totals = torch.stack([elbo.detach(), self._plug_in_log_likelihood(obs, means, log_vars, emission)])
            distributed.all_reduce_([means.grad, log_vars.grad, counts, totals])  # no-op in one process
            optimizer.step()
            emission = self._smooth(counts)
            elbos.append(float(totals[0]) / n)
            log_likelihoods.append(float(totals[1]) / n)
            kl_weights.append(weight)
            if iteration % 50 == 0:
                logger.debug("iteration %d: annealed ELBO %.4f, plug-in log-likelihood %.4f per observation, "
                             "KL weight %.4g", iteration, elbos[-1], log_likelihoods[-1], weight)
            if (iteration >= self.anneal_iters + 2 * self.window and self._has_converged(elbos)
                    and self._has_converged(log_likelihoods)):
                converged = True
                break

        self.means_ = means.detach()
        self.log_vars_ = log_vars.detach()
        self.scales_ = (0.5 * self.log_vars_).exp()
        self.emission_ = emission
        self.n_iter_ = iteration
        self.converged_ = converged
        self.elbos_ = torch.tensor(elbos, dtype=torch.float64)
        self.log_likelihoods_ = torch.tensor(log_likelihoods, dtype=torch.float64)
        self.lower_bounds_ = self.elbos_ * n
        self.kl_weights_ = torch.tensor(kl_weights, dtype=torch.float64)
        if not converged:
            warnings.warn(
                f"variational EM stopped at max_iters = {max_iters} before its ELBO and plug-in log-likelihood settled "
                f"(tol = {self.tol}); raise max_iters or tol",
                ConvergenceWarning,
                stacklevel=2,
            )
        self.diagnostics_ = diagnose_fit(self.to_head(), self.metrics(), objective="elbo",
                                         log_likelihood="log_likelihood", converged=converged, stacklevel=3)
        return self

    def metrics(self) -> pd.DataFrame:
        """One row per iteration: ``step`` (iterations done before it, from 0), ``elbo`` (annealed ELBO per
        observation), ``log_likelihood`` (plug-in training log-likelihood per observation), ``kl_weight``."""
        self._check_fitted()
        return pd.DataFrame({
            "step": range(len(self.elbos_)),
            "elbo": self.elbos_.tolist(),
            "log_likelihood": self.log_likelihoods_.tolist(),
            "kl_weight": self.kl_weights_.tolist(),
        })

    def _initial_emission(self, obs: Observations, generator: torch.Generator, dtype) -> torch.Tensor:
        """Smoothed counts of random last-hop responsibilities (uniform on the simplex, padding excluded)."""
        weights = -torch.rand(obs.keys.shape, generator=generator, dtype=dtype).log()  # Exp(1): Dirichlet(1)
        weights = weights * obs.full_mask()
        counts = self._counts(obs, weights / weights.sum(-1, keepdim=True))
        return self._smooth(distributed.all_reduce_([counts])[0])

    def _e_step(self, obs, means, log_vars, emission, weight, generator):
        """``(annealed ELBO estimate, log emission (S, T))``, the ELBO differentiable in ``means``, ``log_vars`` and
        the log emission.

        The ELBO's gradient in the log emission is the M-step's counts: ``d log p(t_n) / d log E[v, t]`` is the
        posterior probability that row ``n``'s last hop lands on a position of value ``v``, where ``t = t_n``, so
        summed over rows and averaged over the draws it is the ``(S, T)`` table of responsibility-weighted
        counts of ``(value at the last hop, target)``: read from the backward pass the loss makes anyway, not
        from a second forward-backward pass per draw.
        """
        noise = torch.randn((self.mc,) + tuple(means.shape), generator=generator, dtype=means.dtype)
        draws = means + (0.5 * log_vars).exp() * noise
        log_emission = emission.log().requires_grad_()
        log_likelihood = 0.0
        for embeddings in draws:
            factors = embedding_hop_factors(embeddings, log_emission, self.sigma2, self.n_hops)
            log_likelihood = log_likelihood + engine.log_likelihood(factors, obs).sum()
        kl = 0.5 * (means.pow(2) + log_vars.exp() - 1.0 - log_vars).sum()
        if distributed.rank() != 0:
            kl = kl * 0.0  # summed over ranks, the KL term counts once (rank 0's)
        return log_likelihood / self.mc - weight * kl, log_emission

    @torch.no_grad()
    def _plug_in_log_likelihood(self, obs, means, log_vars, emission) -> torch.Tensor:
        """Summed plug-in ``log p(target | context, query)`` of ``obs`` at the current posterior (a 0-dim tensor)."""
        factors = plug_in_hop_factors(means, (0.5 * log_vars).exp(), emission.log(), self.sigma2, self.n_hops,
                                      self.plug_in)
        return engine.log_likelihood(factors, obs).sum().to(means.dtype)

    def _counts(self, obs: Observations, responsibilities: torch.Tensor) -> torch.Tensor:
        """``(S, T)`` responsibility-weighted counts of ``(value at the last hop, target)``."""
        counts = torch.zeros(self.num_symbols, self.num_targets, dtype=responsibilities.dtype)
        counts.index_put_((obs.values, obs.target.unsqueeze(-1).expand_as(obs.values)),
                          responsibilities.detach(), accumulate=True)
        return counts

    def _smooth(self, counts: torch.Tensor) -> torch.Tensor:
        counts = counts + self.emission_smoothing
        return counts / counts.sum(-1, keepdim=True)

    def _has_converged(self, per_observation) -> bool:
        recent = sum(per_observation[-self.window:]) / self.window
        before = sum(per_observation[-2 * self.window: -self.window]) / self.window
        return abs(recent - before) < self.tol

    # -- fitted model ----------------------------------------------------------------------------------
    def to_head(self) -> TiedEmbeddingAttention:
        """A :class:`TiedEmbeddingAttention` holding the fitted posterior and emission (for its inference,
        sampling and plotting); its annealing schedule is this estimator's."""
        self._check_fitted()
        return TiedEmbeddingAttention(
            self.num_symbols,
            self.embed_dim,
            self.num_targets,
            self.n_hops,
            self.sigma2,
            annealing=LinearAnnealing(self.prior_strength, self.anneal_iters),
            plug_in=self.plug_in,
            loc=self.means_,
            scale=self.scales_,
            emission=self.emission_,
            seed=self.seed,
        )

    # Plug-in inference at the posterior means is the head's: one implementation, not a copy.
    def log_likelihood(self, obs: Observations) -> torch.Tensor:
        """``(n,)`` plug-in ``log p(target | context, query)`` (the rule ``plug_in``)."""
        self._check_fitted()
        return self.to_head().log_likelihood(self._check_observations(obs)).detach()

    def predict_proba(self, keys, values=None, query=None, mask=None) -> torch.Tensor:
        """``(n, T)`` plug-in predictive (the rule ``plug_in``); takes arrays or an :class:`Observations`."""
        self._check_fitted()
        return self.to_head().predict_proba(keys, values, query, mask).detach()

    def score(self, obs: Observations) -> float:
        """Mean plug-in log-likelihood per observation."""
        return float(self.log_likelihood(obs).mean())

    def evaluate(self, obs: Observations) -> dict:
        """``{"log_likelihood": mean, "accuracy": argmax accuracy, "n": n}``, as the heads report it."""
        self._check_fitted()
        return self.to_head().evaluate(self._check_observations(obs))

