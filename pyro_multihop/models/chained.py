"""The exact chained (multi-hop) attention head, with the hop latents enumerated in Pyro.

Generative story for one observation (``S`` symbols, ``T`` targets, ``N`` positions, ``L`` hops)::

    q_1 = onehot(query)                                                   # (S,)
    for l = 1..L:
        z_l ~ Categorical(softmax_i(-||q_l - K[l][key_i]||^2 / 2 sigma2))  # position, masked i excluded
        q_{l+1} = onehot(value_{z_l})
    target ~ Categorical(emission[value_{z_L}])                          # (T,)

    query ──> z_1 ──> z_2 ──> ... ──> z_L ──> target
               │        │               │
          (keys, values of the context, observed)

Because queries are one-hot, ``||onehot(v) - K[k]||^2 = 1 - 2 K[k, v] + ||K[k]||^2``: the gate is a
gather from ``K``, never an ``(n, N, N, S)`` tensor. Run with ``TraceEnum_ELBO(max_plate_nesting=1)``:
with the empty guide its loss is the exact negative log-likelihood. ``Trace.format_shapes()`` of the
enumerated model (L = 2, n = 4, N = 6; ``python scripts/model_shapes.py`` prints it)::

     Sample Sites:
    observations dist         |
                value      4  |
             z_1 dist      4  |
                value   6  1  |
             z_2 dist   6  4  |
                value 6 1  1  |
          target dist 6 1  4  |
                value      4  |
"""

from __future__ import annotations

from typing import Optional

import pyro
import torch
from pyro.infer import config_enumerate
from pyro.nn import pyro_method

from .. import engine
from ..data import Observations
from ..distributions import CollapsedHopChain
from ..gate_ops import log_normalize, table_gather
from ..engine.log_space import MASKED_LOGIT, HopChain
from .chained_key_tables import KeyTableScores
from .base import (
    KeyValueAttentionHead,
    attended_values,
    check_positive_int,
    check_sigma2,
    emission_to_logits,
    sample_hop_path,
)

__all__ = ["ChainedAttention", "onehot_gate_logits", "context_ranks", "DISTANCE_UNIT"]

#: Positions per unit of the age and offset slopes of ``ChainedAttention(max_distance=...)``.
DISTANCE_UNIT = 10.0


def onehot_gate_logits(
    key_table: torch.Tensor,
    keys: torch.Tensor,
    query: torch.Tensor,
    mask: Optional[torch.Tensor],
    sigma2: float,
) -> torch.Tensor:
    """Unnormalised log attention ``-||onehot(query) - K[key_i]||^2 / 2 sigma2`` (up to a constant).

    :param key_table: ``(S, S)``; row ``K[k]`` is the key vector of symbol ``k``.
    :param keys: ``(*batch, N)`` key symbols. :param query: ``(*batch)`` query symbols (batch dims
        broadcast, e.g. keys ``(n, N)`` with an enumerated query ``(E, n)``).
    :param mask: ``(*batch, N)`` bool or None; padding gets :data:`~pyro_multihop.engine.log_space.MASKED_LOGIT`.
    :returns: ``(*batch, N)``.
    """
    # ||onehot(v) - K[k]||^2 = 1 - 2 K[k, v] + ||K[k]||^2; the 1 drops out of the softmax. The (S, S) score
    # table is formed first, so the (*batch, N) gate is a single gather.
    scores = (2.0 * key_table - key_table.pow(2).sum(-1, keepdim=True)) / (2.0 * sigma2)
    logits = table_gather(scores, keys, query.unsqueeze(-1))
    return logits if mask is None else logits.masked_fill(~mask, MASKED_LOGIT)


def context_ranks(mask: Optional[torch.Tensor], n: int, N: int, device=None):
    """Where each position sits among the real positions of its context.

    :param mask: ``(n, N)`` bool or None (every position real).
    :returns: ``(rank, age)``, LongTensors ``(n, N)``: ``rank`` counts the real positions before a position,
        ``age`` the real positions after it (0 = the last real position). Values at padding are meaningless
        (padding has zero attention anyway).
    """
    if mask is None:
        rank = torch.arange(N, device=device).expand(n, N)
        return rank, (N - 1) - rank
    rank = mask.long().cumsum(-1) - 1
    return rank, mask.long().sum(-1, keepdim=True) - 1 - rank


class ChainedAttention(KeyValueAttentionHead):
    """L-hop chained responsibility attention with exact (enumerated) hop latents.

    :param int n_hops: ``L``, the number of hops (1 = a single attention head).
    :param int num_symbols: ``S``, symbols of keys, values and queries.
    :param int num_targets: ``T``, target labels.
    :param float sigma2: gate variance (attention temperature), positive.
    :param key_tables: optional ``(L, S, S)`` initial key tables; default ``init``.
    :param emission: optional ``(S, T)`` row-stochastic initial emission; default uniform.
    :param str init: key tables when none are given: ``"random"`` (the default: uniform in ``[0, 1)``,
        rows normalised, the scale of the EM reference's first M-step), ``"identity"`` (each symbol's key
        is its own one-hot, plus ``init_noise``: the answer of every task in :mod:`pyro_multihop.data`,
        so use it to start at a known structure, not to test learning) or ``"zeros"``.
    :param float init_noise: standard deviation of the noise added to ``"identity"`` tables.
    :param seed: seed of the initial key tables (None: torch's global generator).
    :param max_distance: None (the default: the gate sees symbols only) or a positive int ``D``: each hop's
        gate logit then also gets learned terms for where a position is: its *age* (how many real positions
        follow it in the context) and, from hop 2 on, its *offset* from the position ``i`` the previous hop
        attended (in real positions), both clipped to ``D``::

            logit_l(j | i) = content_l(value_i, key_j) + age_slopes[l] * min(age_j, D) / DISTANCE_UNIT
                             + offset_slopes[l - 1] * min(|rank_j - rank_i|, D) / DISTANCE_UNIT
                             + direction_logits[l - 1, value_i] * [rank_j > rank_i]

        (the last term: whether the query symbol looks forward or backward from where the previous hop
        attended). Parameters ``age_slopes (L,)``, ``offset_slopes (L - 1,)`` and ``direction_logits
        (L - 1, S)``, initialised at 0. Slopes rather than one free logit per distance: free tables memorise
        the training stories (measured on bAbI task 2: training accuracy 0.78, test 0.23). Slopes are per
        :data:`DISTANCE_UNIT` (10) positions: per position, an optimiser step on a slope would move the
        logits of a 100-position context by 100 times the step and saturate the gate on position alone
        before the content terms have learnt anything. The chain
        stays a Markov chain over positions (the offset term is a pairwise factor), so inference stays exact
        and ``O(L N^2)``. Order-dependent tasks (bAbI: "where is X *now*") need it. :class:`ChainedEM` has no
        closed-form M-step for these logits and refuses such a model.

    Parameters (``named_parameters()`` and ``state_dict()`` names): ``key_tables`` ``(L, S, S)`` and
    ``emission_logits`` ``(S, T)`` (``emission`` is their row softmax), both unconstrained
    ``torch.nn.Parameter`` objects that Pyro registers under the same names. Example::

        >>> import pyro
        >>> from pyro.infer import TraceEnum_ELBO
        >>> from pyro_multihop import ChainedAttention, transitive_task
        >>> obs = transitive_task(200, seed=0)
        >>> head = ChainedAttention(2, 30, 30, sigma2=0.1)
        >>> loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)
        >>> bool(torch.isclose(loss, -head.log_likelihood(obs).sum()))
        True
    """

    def __init__(
        self,
        n_hops: int,
        num_symbols: int,
        num_targets: int,
        sigma2: float = 0.1,
        *,
        key_tables=None,
        emission=None,
        init: str = "random",
        init_noise: float = 0.1,
        seed: Optional[int] = None,
        max_distance: Optional[int] = None,
    ):
        super().__init__()
        self.n_hops = check_positive_int("n_hops", n_hops)
        self.num_symbols = check_positive_int("num_symbols", num_symbols)
        self.num_targets = check_positive_int("num_targets", num_targets)
        self.sigma2 = check_sigma2(sigma2)
        shape = (n_hops, num_symbols, num_symbols)
        if key_tables is None:
            key_tables = _initial_key_tables(shape, init, init_noise, seed)
        else:
            key_tables = torch.as_tensor(key_tables)
            if not key_tables.dtype.is_floating_point:
                raise TypeError(f"key_tables must be a floating-point tensor, got dtype {key_tables.dtype}")
            if key_tables.shape != shape:
                raise ValueError(
                    f"key_tables must have shape (n_hops, num_symbols, num_symbols) = {shape}, "
                    f"got {tuple(key_tables.shape)}"
                )
            if not torch.isfinite(key_tables).all():
                raise ValueError("key_tables must be finite, got a NaN or inf entry")
        dtype = key_tables.dtype
        if emission is None:
            emission_logits = torch.zeros(num_symbols, num_targets, dtype=dtype)
        else:
            emission_logits = emission_to_logits(emission, (num_symbols, num_targets)).to(dtype)
        # Unconstrained, so plain nn.Parameters: Pyro names them "key_tables" and "emission_logits" (a
        # PyroParam would store them as "key_tables_unconstrained"); see docs/newcomer.md.
        self.key_tables = torch.nn.Parameter(key_tables.detach().clone())
        self.emission_logits = torch.nn.Parameter(emission_logits)
        self.max_distance = None if max_distance is None else check_positive_int("max_distance", max_distance)
        if self.max_distance is not None:
            self.age_slopes = torch.nn.Parameter(torch.zeros(n_hops, dtype=dtype))
            self.offset_slopes = torch.nn.Parameter(torch.zeros(n_hops - 1, dtype=dtype))
            self.direction_logits = torch.nn.Parameter(torch.zeros(n_hops - 1, num_symbols, dtype=dtype))

    @property
    def emission(self) -> torch.Tensor:
        """``(S, T)`` target distribution of each value symbol, rows on the simplex."""
        return self.emission_logits.softmax(-1)

    def config(self) -> dict:
        return {
            "n_hops": self.n_hops,
            "num_symbols": self.num_symbols,
            "num_targets": self.num_targets,
            "sigma2": self.sigma2,
            **({} if self.max_distance is None else {"max_distance": self.max_distance}),
        }

    def svi_defaults(self) -> dict:
        """Settings of :func:`~pyro_multihop.train.fit_svi` for this head, measured by
        ``benchmarks/svi_stability.py``: 1000 full-batch ClippedAdam steps, lr 0.05 decaying to 0.005, and a
        weight decay of 3e-3 on the key tables only (a Gaussian prior of precision ``n * 3e-3``). The gate
        logit is quadratic in the key tables and the exact loss keeps falling as they grow, so without the
        penalty it has no finite minimiser: Adam first amplifies noise-level gradients near zero tables
        (the attend-everywhere saddle), and later steps into ever sharper gates until one overshoots."""
        return {"num_steps": 1000, "lr": 0.05, "lr_decay": 0.1, "batch_size": None, "weight_decay": {"key_tables": 3e-3}}

    def gate_logits(self, hop, keys, query, mask):
        return onehot_gate_logits(self.key_tables[hop], keys, query, mask, self.sigma2)

    def gate_score_tables(self) -> Optional[torch.Tensor]:
        """``(L, S, S)``: ``scores[l, q, k] = (2 K_l[k, q] - ||K_l[k]||^2) / 2 sigma2``, the gate logit of query
        symbol ``q`` meeting key symbol ``k`` at hop ``l + 1`` (:func:`onehot_gate_logits` up to a constant);
        None with ``max_distance``, whose age and offset terms depend on positions (the engine then runs on
        :meth:`hop_chain`'s dense factors)."""
        if self.max_distance is not None:
            return None
        return KeyTableScores(self.key_tables, self.sigma2).dense()

    def score_tables(self) -> Optional[engine.ScoreTables]:
        """The engine's lazy view of :meth:`gate_score_tables` (:class:`~.chained_key_tables.KeyTableScores`, with its closed form of the symbol route's likelihood): a
        query gathers the logits of its own (query, key) pairs from the key tables, and forms the whole
        ``(L, S, S)`` table only where it reads it all; None with ``max_distance``."""
        if self.max_distance is not None:
            return None
        return KeyTableScores(self.key_tables, self.sigma2)

    def _position_logits(self, age_slopes, offset_slopes, direction_logits, values, mask):
        """``(hop, previous position (..., n) or None) -> (..., n, N)``: the age, offset and direction terms."""
        n, N = values.shape
        rank, age = context_ranks(mask, n, N, device=age_slopes.device)
        distance = self.max_distance
        age = age.clamp(0, distance).to(age_slopes.dtype) / DISTANCE_UNIT

        def position_logits(hop: int, previous: Optional[torch.Tensor]) -> torch.Tensor:
            logits = age_slopes[hop] * age  # (n, N)
            if previous is None:
                return logits
            offset = rank - attended_values(rank, previous).unsqueeze(-1)  # (..., n, N)
            distance_term = offset_slopes[hop - 1] * (offset.abs().clamp(max=distance).to(age.dtype) / DISTANCE_UNIT)
            forward = direction_logits[hop - 1][attended_values(values, previous)].unsqueeze(-1)  # (..., n, 1)
            return logits + distance_term + forward * (offset > 0)

        return position_logits

    def hop_chain(self, obs: Observations) -> HopChain:
        """Log factors of the hop chain; with ``max_distance``, the age and offset terms are added."""
        if self.max_distance is None:
            return super().hop_chain(obs)
        n, N = obs.keys.shape
        position_logits = self._position_logits(
            self.age_slopes, self.offset_slopes, self.direction_logits, obs.values, obs.mask
        )
        init = log_normalize(self.gate_logits(0, obs.keys, obs.query, obs.mask) + position_logits(0, None))
        # Hop l > 0 from every position i at once: the "previous position" is arange(N) per row, (n, N).
        keys, mask = obs.keys.unsqueeze(-2), None if obs.mask is None else obs.mask.unsqueeze(-2)
        previous = torch.arange(N, device=obs.keys.device).expand(n, N).t()  # (N_i, n)
        trans = []
        for hop in range(1, self.n_hops):
            content = self.gate_logits(hop, keys, obs.values, mask)  # (n, N_i, N_j)
            trans.append(log_normalize(content + position_logits(hop, previous).transpose(0, 1)))
        return HopChain(init, torch.stack(trans) if trans else init.new_zeros(0, n, N, N))

    @pyro_method
    @config_enumerate
    def model(self, obs: Observations, subsample_size: Optional[int] = None) -> None:
        """Enumerated model: plate ``observations`` (dim -1) over ``n``, hop sites ``z_1..z_L``, ``target``.

        :param obs: the observations; symbols are checked against the model sizes first.
        :param subsample_size: mini-batch size; the likelihood is scaled to the full data.
        """
        self.check_observations(obs)
        key_tables, log_emission = self.key_tables, self.emission_logits.log_softmax(-1)
        with pyro.plate("observations", len(obs), subsample_size=subsample_size, dim=-1) as index:
            batch = obs if subsample_size is None or subsample_size >= len(obs) else obs[index]

            def gate_logits(hop, query):
                return onehot_gate_logits(key_tables[hop], batch.keys, query, batch.mask, self.sigma2)

            position_logits = None
            if self.max_distance is not None:
                position_logits = self._position_logits(
                    self.age_slopes, self.offset_slopes, self.direction_logits, batch.values, batch.mask
                )
            sample_hop_path(
                gate_logits, self.n_hops, batch.query, batch.values, log_emission, batch.target, position_logits
            )

    @pyro_method
    def collapsed_model(self, obs: Observations, subsample_size: Optional[int] = None) -> None:
        """The model with the hop path summed out: one site ``target ~ CollapsedHopChain`` per observation.

        Same plate, same exact likelihood and gradient as :meth:`model`, without enumeration (train it with
        ``Trace_ELBO``, or ``fit_svi(..., collapsed=True)``); the empty :meth:`guide` serves both.
        """
        self.check_observations(obs)
        factors = self.hop_factors()
        with pyro.plate("observations", len(obs), subsample_size=subsample_size, dim=-1) as index:
            batch = obs if subsample_size is None or subsample_size >= len(obs) else obs[index]
            pyro.sample("target", CollapsedHopChain(factors, batch), obs=batch.target)

    @pyro_method
    def guide(self, obs: Observations, subsample_size: Optional[int] = None) -> None:
        """The empty guide: every latent is enumerated, so the ELBO is the exact log-likelihood."""

    def extra_repr(self) -> str:
        extra = "" if self.max_distance is None else f", max_distance={self.max_distance}"
        return super().extra_repr() + f", sigma2={self.sigma2}" + extra


def _initial_key_tables(shape, init: str, init_noise: float, seed: Optional[int]) -> torch.Tensor:
    generator = torch.Generator()
    if seed is None:
        generator.manual_seed(int(torch.randint(2**62, ()).item()))
    else:
        generator.manual_seed(int(seed))
    dtype = torch.get_default_dtype()
    if init == "identity":
        eye = torch.eye(shape[-1], dtype=dtype).expand(shape)
        return eye + init_noise * torch.randn(shape, generator=generator, dtype=dtype)
    if init == "random":
        tables = torch.rand(shape, generator=generator, dtype=dtype)
        return tables / tables.sum(-1, keepdim=True)
    if init == "zeros":
        return torch.zeros(shape, dtype=dtype)
    raise ValueError(f"init must be 'identity', 'random' or 'zeros', got {init!r}")
