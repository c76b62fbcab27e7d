"""What every multi-hop attention head shares: exact inference through its hop chain, validation, sampling,
and the enumerated Pyro sites for the hop latents and the target.

The contract is :class:`HopAttentionHead`: a head supplies ``hop_factors()`` (what it hands the engine),
``check_observations(obs)`` and ``config()``, and gets ``log_likelihood``, ``predict_proba``, ``posterior``,
``hop_marginals``, ``pairwise_marginals``, ``map_paths``, ``k_best_paths``, ``sample_paths``, ``path_entropy``
and ``evaluate``. A head over key/value symbols (:class:`KeyValueAttentionHead`) supplies instead

- ``gate_score_tables()``, the ``(L, S, S)`` gate logits of every (query symbol, key symbol) pair with plug-in
  parameters, or, for a gate with position terms, ``hop_chain(obs) -> HopChain``, the log gate factors of a
  batch, and
- ``emission_logits``, the ``(S, T)`` target table's logits,

and gets ``hop_factors``, ``log_emission``, ``value_marginals`` and ``sample`` as well. Its Pyro ``model`` draws
the hop latents with :func:`sample_hop_path`.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, Optional

import pyro
import torch
from pyro.nn import PyroModule
from pyro.ops.indexing import Vindex

from .. import engine
from ..checks import check_positive_int, check_sigma2
from ..data import Observations
from ..distributions import GateCategorical, TableCategorical
from ..engine.log_space import HopChain, chain_sample_paths

__all__ = ["HopAttentionHead", "KeyValueAttentionHead", "sample_hop_path", "attended_values", "emission_to_logits", "check_positive_int", "check_sigma2"]


def sample_hop_path(
    gate_logits: Callable[[int, torch.Tensor], torch.Tensor],
    n_hops: int,
    query: torch.Tensor,
    values: torch.Tensor,
    log_emission: torch.Tensor,
    target: torch.Tensor,
    position_logits: Optional[Callable[[int, Optional[torch.Tensor]], torch.Tensor]] = None,
) -> None:
    """Pyro sites of the hop path, to be called inside the observations plate (dim -1)::

        q_1 = query                                                    # (n,)
        z_l ~ Categorical(logits=gate_logits(l - 1, q_l))              # (n,), enumerated (N, 1, ...)
        q_{l+1} = values[z_l]                                          # the attended value
        target ~ Categorical(exp(log_emission[q_{L+1}]))               # observed, (n,)

    Each hop's gate is computed from the value attended at the previous hop, exactly as the generative
    story reads; under enumeration ``q_l`` carries the enumerated dims on its left. The observed target
    depends on ``z_L`` and is therefore sampled inside the last ``pyro.markov`` iteration.

    :param gate_logits: ``(hop, query (..., n)) -> (..., n, N)`` unnormalised logits, padding masked.
    :param query: ``(n,)`` query symbols. :param values: ``(n, N)`` value symbols.
    :param log_emission: ``(S, T)`` normalised log emission table. :param target: ``(n,)``.
    :param position_logits: optional ``(hop, previous position (..., n) or None at hop 0) -> (..., n, N)``
        logits added to the gate: terms that depend on where a position is in the context (its age) and
        on where the previous hop attended (the offset), rather than on symbols.
    """
    previous = None
    for hop in pyro.markov(range(n_hops)):
        logits = gate_logits(hop, query)
        if position_logits is not None:
            logits = logits + position_logits(hop, previous)
        position = pyro.sample(f"z_{hop + 1}", GateCategorical(logits), infer={"enumerate": "parallel"})
        previous = position
        query = attended_values(values, position)
        if hop == n_hops - 1:
            pyro.sample("target", TableCategorical(log_emission, query), obs=target)


def attended_values(values: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """``values[..., position]``: the value symbol at each observation's attended position.

    :param values: ``(n, N)``. :param position: ``(..., n)`` positions (broadcasting against ``n``).
    :returns: ``(..., n)``.

    Under parallel enumeration ``position`` is ``arange(N)`` reshaped to ``(N, 1, ..., 1)``, which Pyro marks
    with ``_pyro_categorical_support`` (the marker its own ``Categorical.log_prob`` uses); the answer is
    then a contiguous copy of ``values.T`` (contiguous, so that the next gate's gather writes in order),
    with no gather. Any other ``position`` is gathered.
    """
    if getattr(position, "_pyro_categorical_support", None) is not None and position.dim() >= 2:
        return values.t().contiguous().reshape(position.shape[:-1] + values.shape[:1])
    return Vindex(values)[..., position]


def emission_to_logits(emission, shape) -> torch.Tensor:
    """Validated logits (``log emission``) of a user-given ``(S, T)`` row-stochastic emission table."""
    emission = torch.as_tensor(emission)
    if not emission.dtype.is_floating_point:
        raise TypeError(f"emission must be a floating-point tensor, got dtype {emission.dtype}")
    if emission.shape != shape:
        raise ValueError(f"emission must have shape (num_symbols, num_targets) = {shape}, got {tuple(emission.shape)}")
    if not torch.isfinite(emission).all() or (emission < 0).any():
        raise ValueError("emission must be non-negative and finite (rows on the simplex)")
    row_sums = emission.sum(-1)
    tolerance = 1e-6 if emission.dtype == torch.float64 else 1e-4
    bad = (row_sums - 1).abs() > tolerance
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(f"emission rows must sum to 1 (row-stochastic); row {row} sums to {float(row_sums[row])}")
    return emission.detach().log()


class HopAttentionHead(PyroModule):
    """What every head is: the exact queries of its hop chain, run by the engine on the factors it hands over.

    A head supplies :meth:`hop_factors` (its :class:`~pyro_multihop.engine.HopFactors`), :meth:`check_observations`
    (its data class, refused with ``TypeError``/``ValueError`` naming the field) and :meth:`config`; every query
    here then holds for it. Heads over key/value symbols get more from :class:`KeyValueAttentionHead`.
    """

    n_hops: int
    num_symbols: int
    num_targets: int

    # -- to be supplied by a head --------------------------------------------------------------------
    def hop_factors(self) -> engine.HopFactors:  # pragma: no cover - abstract
        """The factors of the hop chain, every hop's gate and the emission, as the inference engine
        (:mod:`pyro_multihop.engine`) takes them."""
        raise NotImplementedError

    def check_observations(self, obs, name: str = "obs"):  # pragma: no cover - abstract
        """Raise ``TypeError``/``ValueError`` naming the field if ``obs`` does not fit this head; return it."""
        raise NotImplementedError

    def hop_gates(self, *args, **kwargs) -> engine.HopFactors:
        """Deprecated: renamed :meth:`hop_factors` (the factors carry the emission as well as the gates); kept for
        one release."""
        warnings.warn(f"{type(self).__name__}.hop_gates() is deprecated; use hop_factors()", DeprecationWarning,
                      stacklevel=2)
        return self.hop_factors(*args, **kwargs)

    def config(self) -> dict:  # pragma: no cover - abstract
        """JSON-serialisable constructor arguments that rebuild this head (parameters come from its state_dict)."""
        raise NotImplementedError

    def svi_kwargs(self, step: int) -> dict:
        """Extra keyword arguments that SVI passes to ``model`` and ``guide`` at step ``step`` (none here)."""
        return {}

    # -- exact inference (every query runs through pyro_multihop.engine, in chunks under a memory budget) --------
    def log_likelihood(self, obs: Observations, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(n,)`` exact ``log p(target | context, query)``, differentiable in the parameters.

        :param budget: working-memory budget of one chunk in bytes (default
            :func:`pyro_multihop.engine.get_memory_budget`).
        """
        self.check_observations(obs)
        return engine.log_likelihood(self.hop_factors(), obs, budget)

    def predict_proba(self, obs, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(n, T)`` predictive target distribution, the hop latents marginalised (targets unused)."""
        self.check_observations(obs)
        return engine.predict_proba(self.hop_factors(), obs, budget)

    @torch.no_grad()
    def posterior(self, obs: Observations, *, pairwise: bool = False, budget: Optional[int] = None) -> engine.HopPosterior:
        """Exact posterior over hop paths (:class:`~pyro_multihop.engine.HopPosterior`), in one forward-backward
        pass: log-likelihood and hop marginals, the pairwise marginals ``(L - 1, n, N, N)`` only with
        ``pairwise=True`` (otherwise None: they take ``O(n N^2)`` memory); the MAP paths, the entropy and the
        k best paths are computed when first read, and kept."""
        self.check_observations(obs)
        return engine.HopPosterior(self.hop_factors(), obs, budget, pairwise=pairwise)

    @torch.no_grad()
    def hop_marginals(self, obs: Observations, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(L, n, N)`` posterior ``p(z_l = i | observation)``."""
        self.check_observations(obs)
        return engine.hop_marginals(self.hop_factors(), obs, budget)

    @torch.no_grad()
    def pairwise_marginals(self, obs: Observations, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(L - 1, n, N, N)`` posterior ``p(z_l = i, z_{l+1} = j | observation)``."""
        self.check_observations(obs)
        return engine.pairwise_marginals(self.hop_factors(), obs, budget)

    @torch.no_grad()
    def map_paths(self, obs: Observations, *, given_target: bool = True, budget: Optional[int] = None) -> torch.Tensor:
        """``(n, L)`` LongTensor, the most probable hop path given the observation (Viterbi; ties to the lowest
        index). ``given_target=False``: the most probable path of the prior chain, ignoring the targets."""
        self.check_observations(obs)
        return engine.map_paths(self.hop_factors(), obs, budget, given_target=given_target)

    @torch.no_grad()
    def sample_paths(self, obs: Observations, num_samples: int, seed: Optional[int] = None, *,
                     budget: Optional[int] = None) -> torch.Tensor:
        """``(num_samples, n, L)`` hop paths drawn from the exact posterior given the target (forward
        filtering, backward sampling). ``seed``: seed of a private generator (None: a random seed)."""
        check_positive_int("num_samples", num_samples)
        self.check_observations(obs)
        factors = self.hop_factors()
        generator = torch.Generator(device=factors.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        return engine.sample_paths(factors, obs, num_samples, generator, budget)

    @torch.no_grad()
    def path_entropy(self, obs: Observations, *, given_target: bool = True, budget: Optional[int] = None) -> torch.Tensor:
        """``(n,)`` exact entropy, in nats, of the posterior over hop paths given the target
        (``given_target=False``: of the prior over paths, before the target is seen)."""
        self.check_observations(obs)
        return engine.path_entropy(self.hop_factors(), obs, budget, given_target=given_target)

    @torch.no_grad()
    def k_best_paths(self, obs: Observations, k: int, *, given_target: bool = True, budget: Optional[int] = None):
        """``(paths (n, k, L), log_probs (n, k))``: the ``k`` most probable hop paths given the target, best
        first, with their posterior log-probabilities; where fewer than ``k`` paths exist the extra rows
        have log-probability ``-inf``. ``given_target=False``: those of the prior chain, ignoring the targets."""
        check_positive_int("k", k)
        self.check_observations(obs)
        return engine.k_best_paths(self.hop_factors(), obs, k, budget, given_target=given_target)

    @torch.no_grad()
    def evaluate(self, obs: Observations, *, budget: Optional[int] = None) -> dict:
        """``{"log_likelihood": mean per observation, "accuracy": argmax-prediction accuracy, "n": n}``."""
        self.check_observations(obs)
        if len(obs) == 0:
            raise ValueError("obs must hold at least one observation to evaluate, got 0")
        log_likelihood = self.log_likelihood(obs, budget=budget)
        predicted = self.predict_proba(obs, budget=budget).argmax(-1).to(obs.device)
        return {
            "log_likelihood": float(log_likelihood.mean()),
            "accuracy": float((predicted == obs.target).double().mean()),
            "n": len(obs),
        }

    def extra_repr(self) -> str:
        return f"n_hops={self.n_hops}, num_symbols={self.num_symbols}, num_targets={self.num_targets}"


class KeyValueAttentionHead(HopAttentionHead):
    """A head over :class:`~pyro_multihop.data.Observations` (key, value and query symbols) whose target is emitted
    from the last attended value through an ``(S, T)`` table (see the module docstring): it supplies
    ``gate_score_tables`` (or ``hop_chain``) and ``emission_logits``, and gets :meth:`hop_factors`, :meth:`value_marginals`, :meth:`sample` and a
    :meth:`predict_proba` that also takes bare context tensors."""

    # -- to be supplied by a head --------------------------------------------------------------------
    def gate_score_tables(self) -> Optional[torch.Tensor]:
        """``(L, S, S)`` unnormalised gate logits ``scores[l, q, k]`` of hop ``l + 1`` when its query symbol ``q``
        meets key symbol ``k``, or None if the gate depends on more than the two symbols. With tables,
        :meth:`hop_chain` and the engine's fast symbol route come for free."""
        return None

    def hop_chain(self, obs: Observations) -> HopChain:
        """Dense log factors of the hop chain of a batch (``init (n, N)``, ``trans (L - 1, n, N, N)``)."""
        scores = self.gate_score_tables()
        if scores is None:  # pragma: no cover - a head without score tables overrides hop_chain
            raise NotImplementedError(f"{type(self).__name__} must define gate_score_tables() or hop_chain()")
        return engine.chain_from_scores(scores, obs)

    @property
    def log_emission(self) -> torch.Tensor:
        """``(S, T)`` log emission table (row log-softmax of ``emission_logits``)."""
        return self.emission_logits.log_softmax(-1)

    def score_tables(self) -> Optional[engine.ScoreTables]:
        """:meth:`gate_score_tables` as the engine reads them (lazily; by default the whole table, wrapped)."""
        return engine.as_score_tables(self.gate_score_tables())

    def hop_factors(self) -> engine.HopFactors:
        """The factors of the hop chain, every hop's gate and the emission table, as the inference engine
        (:mod:`pyro_multihop.engine`) takes them."""
        tables = self.score_tables()
        dense_chain = self.hop_chain if tables is None else functools.partial(engine.chain_from_scores, tables)
        return engine.HopFactors(self.log_emission, dense_chain, self.n_hops, tables)

    # -- validation ------------------------------------------------------------------------------------
    def check_observations(self, obs: Observations, name: str = "obs") -> Observations:
        """Raise ``TypeError``/``ValueError`` naming the field if ``obs`` does not fit this model."""
        if not isinstance(obs, Observations):
            raise TypeError(f"{name} must be pyro_multihop.Observations, got {type(obs).__name__}")
        obs.check_sizes(self.num_symbols, self.num_targets)
        return obs

    def _context(self, keys, values, query, mask=None) -> Observations:
        if isinstance(keys, Observations):
            return self.check_observations(keys)
        query_tensor = torch.as_tensor(query)
        obs = Observations(keys, values, query, torch.zeros_like(query_tensor, dtype=torch.long), mask)
        obs.check_sizes(self.num_symbols, None)
        return obs

    def predict_proba(self, keys, values=None, query=None, mask=None, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(n, T)`` predictive target distribution, the hop latents marginalised.

        Takes ``(keys (n, N), values (n, N), query (n,), mask=None)`` or an :class:`Observations`.
        """
        obs = self._context(keys, values, query, mask)
        return engine.predict_proba(self.hop_factors(), obs, budget)

    @torch.no_grad()
    def value_marginals(self, obs: Observations, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(L, n, S)`` posterior probability that hop ``l`` attends a position whose value symbol is ``s``."""
        self.check_observations(obs)
        return engine.value_marginals(self.hop_factors(), obs, budget)

    # -- generative sampler -----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, n: int, context_len: int = 6, seed: Optional[int] = None) -> Observations:
        """Draw ``n`` observations from the generative story.

        Context keys, values and the query are uniform over the ``S`` symbols (``context_len``
        positions); the hop path is drawn through the gate, and the target from the emission row of the
        last attended value.
        """
        generator, context = self._random_context(n, context_len, seed)
        return self._sample_targets(context, self.hop_factors(), generator)

    def _random_context(self, n: int, context_len: int, seed: Optional[int]):
        """A seeded generator and ``n`` uniform random contexts and queries (targets still 0)."""
        check_positive_int("n", n)
        check_positive_int("context_len", context_len)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        keys = torch.randint(self.num_symbols, (n, context_len), generator=generator)
        values = torch.randint(self.num_symbols, (n, context_len), generator=generator)
        query = torch.randint(self.num_symbols, (n,), generator=generator)
        return generator, Observations(keys, values, query, torch.zeros(n, dtype=torch.long))

    def _sample_targets(self, context: Observations, factors: engine.HopFactors,
                        generator: torch.Generator) -> Observations:
        """Draw hop paths through the prior chain of ``factors`` (in chunks) and targets from the emission row of
        the last attended value."""
        emission = factors.log_emission.exp().float().cpu()
        target = torch.empty(len(context), dtype=torch.long)
        for rows, chunk, chain, _ in engine.dense_chunks(factors, context, None):
            paths = chain_sample_paths(HopChain(chain.init.cpu(), chain.trans.cpu()), generator)
            last_values = chunk.values.cpu().gather(1, paths[:, -1:]).squeeze(1)
            target[rows] = torch.multinomial(emission[last_values], 1, generator=generator).squeeze(1)
        return Observations(context.keys, context.values, context.query, target)
