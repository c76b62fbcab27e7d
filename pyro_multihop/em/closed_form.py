"""Closed-form EM for the one-hot chained attention head (the reference the Pyro fits are compared to).

One EM iteration on observations ``(keys, values, query, target)`` with weights ``w``:

- **E-step** (:meth:`ChainedEM.e_step`): exact forward-backward over the hop chain ``z_1 -> ... -> z_L`` of
  each observation gives the hop marginals ``gamma_l[n, i] = p(z_l = i | obs_n)`` and the pairwise
  marginals ``xi_l[n, i, j] = p(z_{l-1} = i, z_l = j | obs_n)``. They are reduced at once to additive
  sufficient statistics (:class:`SufficientStats`)::

      key_numerators[0, k, s]  = sum_n w_n sum_i gamma_1[n, i] [key_ni = k] [query_n = s]
      key_numerators[l, k, s]  = sum_n w_n sum_ij xi_l[n, i, j] [key_nj = k] [value_ni = s]      (l >= 1)
      key_masses[l, k]         = sum_s key_numerators[l, k, s]
      emission_counts[v, t]    = sum_n w_n sum_i gamma_L[n, i] [value_ni = v] [target_n = t]

  i.e. hop ``l``'s key ``k`` collects the incoming one-hot queries of the positions that carry it, weighted
  by how much the posterior lands there: the observed query at hop 1, the expected one-hot of the value
  attended at hop ``l - 1`` afterwards.
- **M-step** (:meth:`ChainedEM.m_step`): ``K[l][k] = key_numerators[l, k] / max(key_masses[l, k], 1e-9)``
  (responsibility-weighted means of the incoming queries) and ``emission = counts + smoothing`` with rows
  normalised. The key update ignores the gate's softmax partition function, so it is not an exact
  maximisation: the log-likelihood may fall in some iterations. :meth:`ChainedEM.fit` keeps the best model.

The E-step never builds an ``(n, N, N, S)`` tensor. Its statistics come from the engine's forward-backward
(:func:`pyro_multihop.engine.forward_backward_chunks`) through the transition protocol
(:meth:`~pyro_multihop.engine.ChunkPosterior.key_statistics`), on either of the engine's two routes:

- ``"symbols"``: the gate of hop ``l`` depends on a position pair only through the symbols ``(value_i, key_j)``,
  so the transition matrix of one observation factors through symbol space::

      P_l = diag(1 / R_l) V E_l K^T,   E_l[v, k] = exp(G_l[v, k] - max_k' G_l[v, k']),
      G_l[v, k] = (2 K_l[k, v] - ||K_l[k]||^2) / (2 sigma2),   R_l[i] = sum_j (V E_l K^T)[i, j],

  with ``V``, ``K`` the ``(N, S)`` one-hot matrices of the values and (unpadded) keys. Messages cost two
  ``(n, S) x (S, S)`` products per hop, and the key statistics of a hop one ``(S, n) x (n, S)`` product, with
  no ``(n, N, N)`` tensor;
- ``"positions"``: dense ``(c, N, N)`` transition matrices, ``O(N^2)`` per hop and observation (the cheaper
  route when ``S`` is much larger than ``N``).

Both run in probability space with rescaled messages; an observation that would underflow there (tiny
``sigma2`` with far-apart key tables) is retried on its dense factors, normalised over its own
positions, and recomputed in log space by the engine only if it underflows there too. Both give the same
statistics. Work is chunked over observations under the engine's memory budget
(:func:`pyro_multihop.engine.get_memory_budget`).
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Callable, List, NamedTuple, Optional, Union

import torch

from .. import distributed
from ..data import FactObservations, Observations
from .. import engine
from ..models.base import check_positive_int, check_sigma2
from ..models.chained import ChainedAttention
from ..models.facts import EM_REFUSAL

__all__ = ["ChainedEM", "SufficientStats", "EMResult", "ConvergenceWarning"]

logger = logging.getLogger(__name__)

# Rows of key tables whose responsibility mass is below this are divided by it instead (they stay ~0).
MASS_FLOOR = 1e-9
_ROUTES = ("auto",) + engine.ROUTES
# The E-step's routes under their former names (``method=``), accepted with a DeprecationWarning.
_FORMER_ROUTE_NAMES = {"factored": "symbols", "dense": "positions", "auto": "auto"}


class ConvergenceWarning(UserWarning):
    """EM stopped at ``max_iters`` before the log-likelihood change fell below ``tol``."""


@dataclass(frozen=True, eq=False)
class SufficientStats:
    """Additive EM statistics of a weighted batch of observations (``L`` hops, ``S`` symbols, ``T`` targets).

    Statistics of disjoint batches add: ``e_step(model, a) + e_step(model, b)`` equals the statistics of the
    concatenated data, and the built-in ``sum`` works on a list of them.

    :ivar key_numerators: ``(L, S, S)``; ``[l, k, s]`` is the expected weighted number of times hop ``l + 1``
        lands on a position with key ``k`` while its incoming query is symbol ``s``.
    :ivar key_masses: ``(L, S)``; ``[l, k]``, the expected weighted number of landings on key ``k``
        (the row sums of ``key_numerators``).
    :ivar emission_counts: ``(S, T)``; ``[v, t]``, the expected weighted count of target ``t`` emitted from
        a last-hop value ``v``.
    :ivar loglik: total weighted log-likelihood ``sum_n w_n log p(target_n | context_n, query_n)`` under the
        model of the E-step; NaN for :meth:`ChainedEM.random_stats`, which evaluates no model.
    :ivar n: total weight (the number of observations when unweighted).
    """

    key_numerators: torch.Tensor
    key_masses: torch.Tensor
    emission_counts: torch.Tensor
    loglik: float
    n: float

    @classmethod
    def zeros(cls, n_hops: int, num_symbols: int, num_targets: int, dtype=None, device=None) -> "SufficientStats":
        """Statistics of no data (the identity of ``+``)."""
        options = {"dtype": dtype, "device": device}
        return cls(
            torch.zeros(n_hops, num_symbols, num_symbols, **options),
            torch.zeros(n_hops, num_symbols, **options),
            torch.zeros(num_symbols, num_targets, **options),
            0.0,
            0.0,
        )

    @property
    def shape(self) -> tuple:
        """``(L, S, T)``."""
        return (self.key_numerators.shape[0], self.key_numerators.shape[1], self.emission_counts.shape[1])

    def __add__(self, other) -> "SufficientStats":
        if isinstance(other, int) and other == 0:  # the start value of the built-in sum()
            return self
        if not isinstance(other, SufficientStats):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"cannot add SufficientStats of shapes (L, S, T) = {self.shape} and {other.shape}")
        return SufficientStats(
            self.key_numerators + other.key_numerators,
            self.key_masses + other.key_masses,
            self.emission_counts + other.emission_counts,
            self.loglik + other.loglik,
            self.n + other.n,
        )

    __radd__ = __add__

    def __repr__(self) -> str:
        L, S, T = self.shape
        return f"SufficientStats(L={L}, S={S}, T={T}, loglik={self.loglik:.6g}, n={self.n:.6g})"


class EMResult(NamedTuple):
    """What :meth:`ChainedEM.fit` returns.

    :ivar model: the model with the highest log-likelihood seen (the key M-step may lower it).
    :ivar loglik: ``list[float]``; ``loglik[k]`` is the total weighted log-likelihood of the model after
        ``k`` M-steps (``loglik[0]``: the initial model).
    :ivar best_iteration: index into ``loglik`` of ``model``.
    :ivar converged: whether the last change per unit weight fell to ``tol`` before ``max_iters``.
    :ivar n_iter: number of M-steps run (``len(loglik) - 1``).
    :ivar final_model: the model of the last iteration (``loglik[-1]``).
    """

    model: ChainedAttention
    loglik: List[float]
    best_iteration: int
    converged: bool
    n_iter: int
    final_model: ChainedAttention

    @property
    def best_loglik(self) -> float:
        return self.loglik[self.best_iteration]


class ChainedEM:
    """Closed-form EM for :class:`~pyro_multihop.models.ChainedAttention` (see the module docstring).

    Settings are stored as given; nothing is fitted until :meth:`fit`, which also sets ``result_`` and
    ``model_``.

    :param int n_hops: ``L``. :param int num_symbols: ``S``. :param int num_targets: ``T``.
    :param float sigma2: gate variance of the models it builds (fixed; EM does not fit it).
    :param float emission_smoothing: pseudo-count added to every emission count (>= 0). With 0, a value
        symbol that is never attended at the last hop gets a uniform emission row.
    :param chunk_size: observations per E-step chunk; None picks as many as the engine's memory budget allows
        (:func:`pyro_multihop.engine.get_memory_budget`).
    :param str route: the engine route of the E-step, ``"symbols"`` (symbol-space messages, ``O(S^2)`` per
        hop and observation), ``"positions"`` (dense ``(N, N)`` transitions, ``O(N^2)``), or ``"auto"``: the
        engine's choice (:func:`pyro_multihop.engine.choose_route`). Both give the same statistics.
    :param str method: deprecated name of ``route`` (``"factored"`` for ``"symbols"``, ``"dense"`` for
        ``"positions"``).

    Example::

        >>> from pyro_multihop import transitive_task
        >>> from pyro_multihop.em import ChainedEM
        >>> train = transitive_task(500, seed=0)
        >>> em = ChainedEM(n_hops=2, num_symbols=30, num_targets=30)
        >>> result = em.fit(train, max_iters=20, seed=0)
        >>> len(result.loglik) <= 21 and result.loglik[result.best_iteration] == max(result.loglik)
        True
        >>> stats = em.e_step(result.model, train[:250]) + em.e_step(result.model, train[250:])
        >>> model = em.m_step(stats)   # one more EM iteration, by hand
    """

    def __init__(
        self,
        n_hops: int,
        num_symbols: int,
        num_targets: int,
        sigma2: float = 0.1,
        emission_smoothing: float = 1e-4,
        *,
        chunk_size: Optional[int] = None,
        route: str = "auto",
        method: Optional[str] = None,
    ):
        self.n_hops = check_positive_int("n_hops", n_hops)
        self.num_symbols = check_positive_int("num_symbols", num_symbols)
        self.num_targets = check_positive_int("num_targets", num_targets)
        self.sigma2 = check_sigma2(sigma2)
        smoothing = float(emission_smoothing)
        if not math.isfinite(smoothing) or smoothing < 0:
            raise ValueError(f"emission_smoothing must be a finite number >= 0, got {emission_smoothing!r}")
        self.emission_smoothing = smoothing
        if chunk_size is not None:
            check_positive_int("chunk_size", chunk_size)
        self.chunk_size = chunk_size
        if method is not None:
            if method not in _FORMER_ROUTE_NAMES:
                raise ValueError(f"method must be one of {tuple(_FORMER_ROUTE_NAMES)}, got {method!r}")
            warnings.warn(f"ChainedEM(method={method!r}) is deprecated; use route={_FORMER_ROUTE_NAMES[method]!r}",
                          DeprecationWarning, stacklevel=2)
            route = _FORMER_ROUTE_NAMES[method]
        if route not in _ROUTES:
            raise ValueError(f"route must be one of {_ROUTES}, got {route!r}")
        self.route = route

    def __repr__(self) -> str:
        return (
            f"ChainedEM(n_hops={self.n_hops}, num_symbols={self.num_symbols}, num_targets={self.num_targets}, "
            f"sigma2={self.sigma2}, emission_smoothing={self.emission_smoothing})"
        )

    # -- E-step ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def e_step(self, model: ChainedAttention, obs: Observations, weights=None) -> SufficientStats:
        """Exact posterior expectations of the sufficient statistics under ``model``.

        :param model: a :class:`ChainedAttention` with this estimator's ``n_hops``, sizes and ``sigma2``;
            the statistics follow its dtype and device.
        :param obs: observations (padding positions get no mass).
        :param weights: optional ``(n,)`` non-negative weights; a row of weight 0 has no effect.
        :raises ValueError: on mismatched sizes, symbols out of range, bad weights, or an observation whose
            target has probability 0 under ``model``.
        """
        self._check_model(model)
        model.check_observations(obs)
        dtype, device = model.key_tables.dtype, model.key_tables.device
        obs, weights = self._prepare(obs, weights, dtype, device)
        stats = SufficientStats.zeros(self.n_hops, self.num_symbols, self.num_targets, dtype, device)
        if len(obs) == 0:
            return stats
        accumulator = _Accumulator(stats)
        route = None if self.route == "auto" else self.route
        retried, in_log_space = 0, 0
        for part in engine.forward_backward_chunks(model.hop_factors(), obs, rows=self.chunk_size, route=route):
            w = weights[part.rows]
            accumulator.add_likelihood(part.log_likelihood, w)
            accumulator.add_posterior(part, w)
            retried += len(part.obs) if part.route == "dense" else 0
            in_log_space += len(part.obs) if part.route == "log" else 0
        if retried or in_log_space:
            logger.debug("E-step: %d observations retried on their dense factors, %d more fall back to log space",
                         retried, in_log_space)
        return accumulator.result()

    # -- M-step ----------------------------------------------------------------------------------------
    @torch.no_grad()
    def m_step(self, stats: SufficientStats) -> ChainedAttention:
        """The model whose key tables and emission are the closed-form updates of ``stats``.

        ``K[l][k] = key_numerators[l, k] / max(key_masses[l, k], 1e-9)``;
        ``emission[v] = (emission_counts[v] + smoothing) / sum_t (emission_counts[v, t] + smoothing)``.
        The model has the dtype and device of ``stats``.
        """
        if not isinstance(stats, SufficientStats):
            raise TypeError(f"stats must be SufficientStats, got {type(stats).__name__}")
        expected = (self.n_hops, self.num_symbols, self.num_targets)
        if stats.shape != expected:
            raise ValueError(
                f"stats must have shape (n_hops, num_symbols, num_targets) = {expected}, got {stats.shape}"
            )
        key_tables = stats.key_numerators / stats.key_masses.clamp_min(MASS_FLOOR).unsqueeze(-1)
        counts = stats.emission_counts + self.emission_smoothing
        totals = counts.sum(-1, keepdim=True)
        tiny = torch.finfo(counts.dtype).tiny
        emission = torch.where(totals > 0, counts / totals.clamp_min(tiny), 1.0 / self.num_targets)
        return ChainedAttention(
            self.n_hops,
            self.num_symbols,
            self.num_targets,
            self.sigma2,
            key_tables=key_tables,
            emission=emission,
        ).to(stats.key_numerators.device)

    # -- initialisation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def random_stats(self, obs: Observations, seed: Optional[int] = 0, weights=None, dtype=None) -> SufficientStats:
        """Statistics of random responsibilities, the initialisation of :meth:`fit`.

        Each observation gets hop marginals drawn from a flat Dirichlet over its real positions for every
        hop and, for hops ``l >= 2``, pairwise responsibilities drawn from a flat Dirichlet over the real
        position pairs; they are reduced like posterior marginals (hop 1 and the emission from the hop
        marginals, later hops from the pairwise ones). ``loglik`` is NaN: no model is evaluated.

        :param seed: seed of the draws (None: nondeterministic).
        :param dtype: dtype of the statistics (default ``torch.get_default_dtype()``).
        """
        obs = self._check_data(obs)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        device = obs.device
        obs, weights = self._prepare(obs, weights, dtype, device)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        stats = SufficientStats.zeros(self.n_hops, self.num_symbols, self.num_targets, dtype, device)
        accumulator = _Accumulator(stats)
        N = obs.context_len
        # gamma (L, N) and xi (L - 1, N, N) a row, with their draws and the pair index: about 3 times xi.
        itemsize = torch.finfo(dtype).bits // 8
        row_bytes = itemsize * 3 * (self.n_hops * N + max(self.n_hops - 1, 1) * N * N)
        rows = self.chunk_size if self.chunk_size is not None else engine.rows_within_budget(row_bytes)
        for start in range(0, len(obs), rows):
            chunk = obs[start : start + rows]
            c = len(chunk)
            mask = chunk.full_mask().to(dtype)
            gamma = _flat_dirichlet((self.n_hops, c, N), generator, dtype).to(device) * mask
            gamma = gamma / gamma.sum(-1, keepdim=True)
            pair_mask = (mask.unsqueeze(-1) * mask.unsqueeze(-2)).flatten(-2)
            xi = _flat_dirichlet((self.n_hops - 1, c, N * N), generator, dtype).to(device) * pair_mask
            xi = (xi / xi.sum(-1, keepdim=True)).unflatten(-1, (N, N))
            accumulator.add_marginals(chunk, weights[start : start + c], gamma, xi)
            accumulator.n += float(weights[start : start + c].double().sum())
        stats = accumulator.result()
        return SufficientStats(stats.key_numerators, stats.key_masses, stats.emission_counts, math.nan, stats.n)

    # -- fit -------------------------------------------------------------------------------------------
    def fit(
        self,
        obs: Observations,
        weights=None,
        *,
        max_iters: int = 100,
        tol: float = 1e-5,
        seed: Optional[int] = 0,
        init: Union[None, ChainedAttention, SufficientStats] = None,
        callback: Optional[Callable[[int, ChainedAttention, SufficientStats], None]] = None,
        dtype=None,
    ) -> EMResult:
        """Run EM from ``init`` until the log-likelihood per unit weight changes by at most ``tol``.

        Iteration ``k`` evaluates the current model (E-step, recording ``loglik[k]``), stops if
        ``|loglik[k] - loglik[k-1]| <= tol * n``, and otherwise moves to the M-step's model. After
        ``max_iters`` M-steps the last model is evaluated too, and a :class:`ConvergenceWarning` is issued.

        Under a ``torch.distributed`` process group, ``obs`` (and ``weights``) are this process's shard of
        the rows (possibly empty): each E-step's statistics are summed over the processes in one
        all-reduce (:func:`pyro_multihop.distributed.all_reduce_stats`), so every process runs the same
        M-step and returns the same result, that of EM on the union of the shards. ``init`` must be the
        same model on every process; a ``seed`` gives each shard its own random responsibilities.

        :param obs: training observations (at least one, with positive total weight).
        :param weights: optional ``(n,)`` non-negative observation weights.
        :param int max_iters: most M-steps to run (>= 1).
        :param float tol: convergence threshold on the change of the mean log-likelihood (>= 0).
        :param seed: seed of :meth:`random_stats` when ``init`` is None.
        :param init: None (random responsibilities, then an M-step), a starting :class:`ChainedAttention`,
            or :class:`SufficientStats` to start from their M-step.
        :param callback: called as ``callback(k, model, stats)`` after every E-step.
        :param dtype: dtype of the models when ``init`` is None (default ``torch.get_default_dtype()``).
        :returns: :class:`EMResult`; also stored as ``self.result_`` (and its best model as ``self.model_``).
        """
        with distributed.agreed():  # a bad shard ends every rank, not only its own
            obs = self._check_data(obs)
            if weights is not None:
                _check_weights(weights, len(obs))
        check_positive_int("max_iters", max_iters)
        tol = float(tol)
        if not math.isfinite(tol) or tol < 0:
            raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
        # Under a process group obs is this rank's shard; statistics are summed over all shards.
        if distributed.all_reduce_sum(len(obs))[0] == 0:
            raise ValueError("obs must hold at least one observation to fit, got 0")
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        if init is None:
            seed = None if seed is None else distributed.rank_seed(seed)  # each shard its own draws
            model = self.m_step(distributed.all_reduce_stats(self.random_stats(obs, seed=seed, weights=weights, dtype=dtype)))
        elif isinstance(init, SufficientStats):
            model = self.m_step(init)
        elif isinstance(init, ChainedAttention):
            self._check_model(init, name="init")
            model = init
        else:
            raise TypeError(f"init must be None, a ChainedAttention or SufficientStats, got {type(init).__name__}")

        history: List[float] = []
        best_model, best_iteration = model, 0
        converged = False
        for iteration in range(max_iters + 1):
            stats = distributed.all_reduce_stats(self.e_step(model, obs, weights))
            if iteration == 0 and stats.n <= 0:
                raise ValueError("weights must have a positive total to fit, got 0")
            history.append(stats.loglik)
            if callback is not None:
                callback(iteration, model, stats)
            if stats.loglik > history[best_iteration] or iteration == 0:
                best_model, best_iteration = model, iteration
            if iteration > 0 and abs(history[-1] - history[-2]) <= tol * stats.n:
                converged = True
                break
            if iteration == max_iters:
                break
            model = self.m_step(stats)
        if not converged:
            warnings.warn(
                f"ChainedEM did not converge in max_iters = {max_iters} iterations: the last change of the "
                f"mean log-likelihood was {abs(history[-1] - history[-2]) / stats.n:.3g} > tol = {tol:g}",
                ConvergenceWarning,
                stacklevel=2,
            )
        result = EMResult(best_model, history, best_iteration, converged, len(history) - 1, model)
        self.result_ = result
        self.model_ = best_model
        return result

    # -- helpers ---------------------------------------------------------------------------------------
    def _check_model(self, model, name: str = "model") -> None:
        if callable(getattr(model, "em_refusal", None)):  # a head without a closed-form M-step says why
            raise TypeError(f"{name}: {model.em_refusal()}")
        if not isinstance(model, ChainedAttention):
            raise TypeError(f"{name} must be a ChainedAttention, got {type(model).__name__}")
        if getattr(model, "max_distance", None) is not None:
            # The age and offset logits sit inside each hop's softmax normaliser, so the expected complete-data
            # log-likelihood has no closed-form maximiser in them (unlike the key tables' weighted means).
            raise ValueError(
                f"{name}.max_distance = {model.max_distance}: ChainedEM has no closed-form M-step for the age "
                "and offset logits (they enter each hop's softmax normaliser); fit such a head with fit_svi"
            )
        for field in ("n_hops", "num_symbols", "num_targets", "sigma2"):
            if getattr(model, field) != getattr(self, field):
                raise ValueError(
                    f"{name}.{field} = {getattr(model, field)} does not match this ChainedEM's "
                    f"{field} = {getattr(self, field)}"
                )

    def _check_data(self, obs) -> Observations:
        if isinstance(obs, FactObservations):
            raise TypeError(f"obs holds facts (FactObservations), the data of FactAttention. {EM_REFUSAL}")
        if not isinstance(obs, Observations):
            raise TypeError(f"obs must be pyro_multihop.Observations, got {type(obs).__name__}")
        obs.check_sizes(self.num_symbols, self.num_targets)
        return obs

    def _prepare(self, obs: Observations, weights, dtype, device):
        """The observations (where they are: the engine moves chunks) and their weights on ``device``, rows of
        weight 0 dropped."""
        if weights is None:
            return obs, torch.ones(len(obs), dtype=dtype, device=device)
        weights = _check_weights(weights, len(obs)).to(dtype=dtype, device=device)
        keep = weights > 0
        if not keep.all():
            obs, weights = obs[keep.to(obs.device)], weights[keep]
        return obs, weights


def _check_weights(weights, n: int) -> torch.Tensor:
    weights = weights if isinstance(weights, torch.Tensor) else torch.as_tensor(weights)
    if weights.dtype == torch.bool or weights.is_complex():
        raise TypeError(f"weights must be real numbers, got dtype {weights.dtype}")
    if weights.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), one per observation, got {tuple(weights.shape)}")
    weights = weights.to(torch.float64)
    if not torch.isfinite(weights).all():
        raise ValueError("weights must be finite, got a NaN or inf entry")
    if (weights < 0).any():
        raise ValueError(f"weights must be non-negative, got {float(weights.min())}")
    return weights


def _flat_dirichlet(shape, generator: torch.Generator, dtype) -> torch.Tensor:
    """Unnormalised Dirichlet(1, ..., 1) draws over the last dim: i.i.d. Exponential(1) variates."""
    return torch.empty(shape, dtype=dtype).exponential_(generator=generator)


class _Accumulator:
    """Mutable sums behind one :class:`SufficientStats` (in place, on flattened (key, symbol) indices)."""

    def __init__(self, stats: SufficientStats):
        self.key_numerators = stats.key_numerators.clone()
        self.key_masses = stats.key_masses.clone()
        self.emission_counts = stats.emission_counts.clone()
        self.loglik = torch.zeros((), dtype=torch.float64, device=stats.key_numerators.device)
        self.n = stats.n
        self.S = stats.key_numerators.shape[-1]
        self.T = stats.emission_counts.shape[-1]

    def result(self) -> SufficientStats:
        return SufficientStats(self.key_numerators, self.key_masses, self.emission_counts, float(self.loglik), self.n)

    def add_likelihood(self, log_likelihood: torch.Tensor, weights: torch.Tensor) -> None:
        """Add the weighted log-likelihoods ``(c,)`` of evaluated rows and their weight."""
        bad = ~torch.isfinite(log_likelihood)
        if bad.any():
            raise ValueError(
                "obs holds an observation with zero likelihood under the model (its target has probability 0 "
                "on every hop path); give it weight 0 or smooth the emission"
            )
        self.loglik += (weights.double() * log_likelihood.double()).sum()
        self.n += float(weights.double().sum())

    def add_first_hop(self, chunk: Observations, weighted_gamma: torch.Tensor) -> None:
        """Hop 1: the incoming query is the observed one. ``weighted_gamma``: ``(c, N)``."""
        pairs = chunk.keys * self.S + chunk.query.unsqueeze(-1)
        self.key_numerators[0].view(-1).index_add_(0, pairs.flatten(), weighted_gamma.flatten())
        self.key_masses[0].index_add_(0, chunk.keys.flatten(), weighted_gamma.flatten())

    def add_emission(self, chunk: Observations, weighted_gamma: torch.Tensor) -> None:
        """Last hop: ``weighted_gamma`` ``(c, N)`` of emitting the target from each position's value."""
        pairs = chunk.values * self.T + chunk.target.unsqueeze(-1)
        self.emission_counts.view(-1).index_add_(0, pairs.flatten(), weighted_gamma.flatten())

    def add_keys(self, hop: int, chunk: Observations, key_statistics: torch.Tensor, weighted_gamma: torch.Tensor) -> None:
        """Hop ``hop >= 1`` (0-based): ``key_statistics`` ``(S, S)`` [key, incoming value] and the weighted
        landings ``(c, N)`` on each position's key."""
        self.key_numerators[hop] += key_statistics
        self.key_masses[hop].index_add_(0, chunk.keys.flatten(), weighted_gamma.flatten())

    def add_marginals(self, chunk: Observations, weights, gamma: torch.Tensor, xi: torch.Tensor) -> None:
        """Accumulate from explicit hop marginals ``(L, c, N)`` and pairwise marginals ``(L-1, c, N, N)``."""
        w = weights.unsqueeze(-1)
        self.add_first_hop(chunk, w * gamma[0])
        for hop in range(1, gamma.shape[0]):
            weighted = xi[hop - 1] * w.unsqueeze(-1)
            statistics = engine.key_statistics_from_pairwise(weighted, chunk.keys, chunk.values, self.S)
            self.add_keys(hop, chunk, statistics, weighted.sum(1))
        self.add_emission(chunk, w * gamma[-1])

    def add_posterior(self, part: engine.ChunkPosterior, weights: torch.Tensor) -> None:
        """Accumulate the statistics of one chunk of the engine's forward-backward (either route, or its
        log-space rows), through its transitions: no ``(c, N, N)`` tensor on the symbol route."""
        chunk, w = part.obs, weights.unsqueeze(-1)
        gamma = part.hop_marginals
        self.add_first_hop(chunk, w * gamma[0])
        for hop in range(1, gamma.shape[0]):
            self.add_keys(hop, chunk, part.key_statistics(hop - 1, weights, self.S), w * gamma[hop])
        self.add_emission(chunk, w * gamma[-1])

