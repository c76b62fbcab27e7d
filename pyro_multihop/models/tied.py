"""The tied-embedding multi-hop head: one latent embedding per symbol, used as query, key and value, with a
mean-field normal posterior, the hop latents enumerated, and the KL term annealed.

Generative story (``S`` symbols, ``D`` embedding dims, ``T`` targets, ``N`` positions, ``L`` hops)::

    e ~ Normal(0, 1)                                                    # (S, D), one site "embeddings"
    for each observation (plate "observations", dim -1):
        q_1 = e[query]                                                  # (D,)
        for l = 1..L:
            z_l ~ Categorical(softmax_i(-||q_l - e[key_i]||^2 / 2 sigma2))   # position, masked i excluded
            q_{l+1} = e[value_{z_l}]
        target ~ Categorical(emission[value_{z_L}])                    # (T,), emission a parameter

              e (global, continuous) ─────────────┐
              │                                   │
    query ──> z_1 ──> z_2 ──> ... ──> z_L ──> target
               (keys, values of the context, observed)

The same embeddings serve every hop (there are no per-hop tables), so identity matching is free: a symbol
always matches itself, and learning is about pulling *different* symbols apart. The gate depends on ``e``
only through the ``(S, S)`` matrix of squared distances between embeddings, computed once per draw; the
gate factors are gathers from it (no ``(n, N, N, D)`` tensor, whatever ``N``).

Inference: the guide is :class:`~pyro_multihop.guides.MeanFieldNormalGuide` over ``"embeddings"`` only;
the hop latents are summed exactly by ``TraceEnum_ELBO(max_plate_nesting=1)``. The ELBO is annealed: the
model's prior site and the guide's site are both under ``scale_kl(kl_weight)``, so the loss is
``-(n / batch) * sum_batch log p(target | e) - kl_weight * (log p(e) - log q(e))`` at the guide's draw ``e``,
whose expectation is ``-E_q[log-likelihood] + kl_weight * KL(q || p)``. ``svi_kwargs(step)`` gives the
schedule's weight for each step. ``Trace.format_shapes()`` of the enumerated model (L = 2, n = 4, N = 6,
S = 18, D = 8; the model traced under ``poutine.enum(first_available_dim=-2)``)::

        Sample Sites:
      embeddings dist         | 18 8
                value         | 18 8
    observations dist         |
                value      4  |
             z_1 dist      4  |
                value   6  1  |
             z_2 dist   6  4  |
                value 6 1  1  |
          target dist 6 1  4  |
                value      4  |

Plug-in quantities (``log_likelihood``, ``posterior``, ``map_paths``, ``evaluate``, ``predict_proba``) put
one ``(S, S)`` table of squared distances into the gate. With ``plug_in="expected"`` (the default) it is the
posterior expectation of the squared distance::

    E_q ||e_s - e_t||^2 = ||m_s - m_t||^2 + sum_d (s_sd^2 + s_td^2)      (s != t; 0 for s = t)

(``m``, ``s`` the posterior means and standard deviations), i.e. the gate at the expected log-potential,
as mean-field variational Bayes updates a discrete factor. ``plug_in="mean"`` uses the distances between
the means alone. The two agree when the posterior is narrow. They differ where the noise, not the means,
separates the symbols: on a task that needs only identity matching the posterior can sit near the prior
(any distinct embeddings do), and the means alone then attend almost uniformly. ``docs/tied.md`` measures
both. ``predict_proba(..., num_samples=M)`` averages the predictive over ``M`` draws of the posterior instead.
"""

from __future__ import annotations

import functools
from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import config_enumerate
from pyro.nn import pyro_method

from .. import engine
from ..checks import check_number
from ..data import Observations
from ..distributions import CollapsedHopChain
from ..embeddings import SymbolEmbeddings
from ..gate_ops import table_gather
from ..guides.annealing import AnnealingSchedule, check_kl_weight, make_schedule, scale_kl
from ..guides.mean_field import MeanFieldNormalGuide
from ..engine.log_space import MASKED_LOGIT, HopChain
from ..engine.moved_names import deprecated_aliases
from .base import KeyValueAttentionHead, check_positive_int, check_sigma2, emission_to_logits, sample_hop_path

__all__ = [
    "PLUG_IN_RULES",
    "TiedEmbeddingAttention",
    "embedding_gate_logits",
    "embedding_score_tables",
    "embedding_hop_factors",
    "squared_distances",
    "expected_squared_distances",
    "plug_in_distances",
    "plug_in_hop_factors",
]

#: The plug-in rules of :class:`TiedEmbeddingAttention` (see the module docstring).
PLUG_IN_RULES = ("expected", "mean")

# Renamed with HopGates -> HopFactors; the old names are kept for one release.
__getattr__ = deprecated_aliases(__name__, {"embedding_hop_gates": (__name__, "embedding_hop_factors"),
                                            "plug_in_hop_gates": (__name__, "plug_in_hop_factors")})

# Above this many elements in the (S, S', D) difference tensor, distances use the Gram form.
_EXPLICIT_DIFFERENCE_LIMIT = 2**20


def squared_distances(a: torch.Tensor, b: Optional[torch.Tensor] = None, method: str = "auto") -> torch.Tensor:
    """``(..., S, S')`` matrix of ``||a_s - b_t||^2``; ``b = None`` means ``b = a`` (zero diagonal).

    :param a: ``(..., S, D)``. :param b: ``(..., S', D)`` or None.
    :param str method: ``"explicit"`` (differences, exact to rounding; ``S S' D`` memory), ``"gram"``
        (``|a|^2 + |b|^2 - 2 a.b`` clamped at 0; ``S S'`` memory) or ``"auto"`` (explicit while the difference
        tensor has at most 2**20 elements).
    """
    same = b is None
    b = a if same else b
    if method == "auto":
        method = "explicit" if a.shape[-2] * b.shape[-2] * a.shape[-1] <= _EXPLICIT_DIFFERENCE_LIMIT else "gram"
    if method == "explicit":
        return (a.unsqueeze(-2) - b.unsqueeze(-3)).pow(2).sum(-1)
    if method != "gram":
        raise ValueError(f"method must be 'auto', 'explicit' or 'gram', got {method!r}")
    gram = a @ b.transpose(-1, -2)
    distances = (a.pow(2).sum(-1).unsqueeze(-1) + b.pow(2).sum(-1).unsqueeze(-2) - 2.0 * gram).clamp_min(0.0)
    if same:
        # The diagonal is 0 exactly (rounding would leave it at +-eps |a|^2).
        eye = torch.eye(a.shape[-2], dtype=torch.bool, device=a.device)
        distances = distances.masked_fill(eye, 0.0)
    return distances


def expected_squared_distances(loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(S, S)`` posterior expectation of ``||e_s - e_t||^2`` under ``e ~ Normal(loc, scale)`` (independent
    entries): ``||loc_s - loc_t||^2 + sum_d (scale_sd^2 + scale_td^2)`` off the diagonal, 0 on it (a symbol's
    distance to itself is 0 in every draw).

    :param loc: ``(S, D)`` means. :param scale: ``(S, D)`` standard deviations.

    It equals :func:`squared_distances` of the means augmented by ``S`` dimensions, ``sqrt(sum_d scale_sd^2)``
    times the one-hot of ``s``.
    """
    variance = scale.pow(2).sum(-1)
    off_diagonal = ~torch.eye(loc.shape[-2], dtype=torch.bool, device=loc.device)
    return squared_distances(loc) + (variance.unsqueeze(-1) + variance.unsqueeze(-2)) * off_diagonal


def embedding_gate_logits(
    distances: torch.Tensor,
    keys: torch.Tensor,
    query: torch.Tensor,
    mask: Optional[torch.Tensor],
    sigma2: float,
) -> torch.Tensor:
    """Unnormalised log attention ``-||e[query] - e[key_i]||^2 / 2 sigma2``, a gather from the distances.

    :param distances: ``(S, S)`` squared distances between embeddings (:func:`squared_distances`).
    :param keys: ``(*batch, N)``. :param query: ``(*batch)`` (batch dims broadcast, e.g. keys ``(n, N)``
        with an enumerated query ``(E, n)``). :param mask: ``(*batch, N)`` bool or None.
    :returns: ``(*batch, N)``.
    """
    logits = table_gather(distances / (-2.0 * sigma2), query.unsqueeze(-1), keys)
    return logits if mask is None else logits.masked_fill(~mask, MASKED_LOGIT)


def embedding_score_tables(embeddings: torch.Tensor, sigma2: float, n_hops: int) -> torch.Tensor:
    """``(*batch, L, S, S)`` gate score tables of the tied head at ``embeddings (*batch, S, D)``: the same
    table ``-||e_q - e_k||^2 / 2 sigma2`` at every hop (an expanded view)."""
    table = squared_distances(embeddings) / (-2.0 * sigma2)
    return table.unsqueeze(-3).expand(table.shape[:-2] + (n_hops,) + table.shape[-2:])


def embedding_hop_factors(embeddings: torch.Tensor, log_emission: torch.Tensor, sigma2: float,
                          n_hops: int) -> engine.HopFactors:
    """The engine's view (:class:`~pyro_multihop.engine.HopFactors`) of the tied head at ``embeddings (S, D)``
    with the ``(S, T)`` log emission table."""
    return _score_hop_factors(embedding_score_tables(embeddings, sigma2, n_hops), log_emission, n_hops)


def plug_in_distances(loc: torch.Tensor, scale: torch.Tensor, plug_in: str = "expected") -> torch.Tensor:
    """``(S, S)`` squared distances of a plug-in rule (:data:`PLUG_IN_RULES`) at the posterior ``loc``,
    ``scale`` (``(S, D)`` each): :func:`expected_squared_distances` or :func:`squared_distances` of ``loc``."""
    if plug_in == "expected":
        return expected_squared_distances(loc, scale)
    if plug_in == "mean":
        return squared_distances(loc)
    raise ValueError(f"plug_in must be one of {PLUG_IN_RULES}, got {plug_in!r}")


def plug_in_hop_factors(loc: torch.Tensor, scale: torch.Tensor, log_emission: torch.Tensor, sigma2: float,
                        n_hops: int, plug_in: str = "expected") -> engine.HopFactors:
    """The engine's view of the tied head's plug-in rule at the posterior ``loc``, ``scale`` (``(S, D)``)."""
    scores = (plug_in_distances(loc, scale, plug_in) / (-2.0 * sigma2)).expand(n_hops, -1, -1)
    return _score_hop_factors(scores, log_emission, n_hops)


def _score_hop_factors(scores: torch.Tensor, log_emission: torch.Tensor, n_hops: int) -> engine.HopFactors:
    return engine.HopFactors(log_emission, functools.partial(engine.chain_from_scores, scores), n_hops, scores)


class TiedEmbeddingAttention(KeyValueAttentionHead):
    """L-hop attention over tied latent embeddings with a mean-field posterior (see the module docstring).

    :param int num_symbols: ``S``, symbols of keys, values and queries.
    :param int embed_dim: ``D``, dimension of the embeddings.
    :param int num_targets: ``T``, target labels.
    :param int n_hops: ``L`` (1 = a single attention head).
    :param float sigma2: gate variance (attention temperature), positive; 0.3 as in the reference.
    :param annealing: KL-weight schedule for SVI: an :class:`~pyro_multihop.guides.AnnealingSchedule`, its
        ``config()`` dict, or None for ``LinearAnnealing(prior_strength=0.01, anneal_steps=100)``
        (:data:`~pyro_multihop.guides.annealing.DEFAULT_PRIOR_STRENGTH`; the reference's 0.1 lets the means
        collapse on identity-matching tasks, ``docs/tied.md``). ``Constant(w)`` switches annealing off.
    :param str plug_in: the distance table of the plug-in quantities: ``"expected"`` (default, the posterior
        expectation of the squared distances, :func:`expected_squared_distances`) or ``"mean"`` (between the
        posterior means); see the module docstring.
    :param float init_loc_scale: standard deviation of the random initial posterior means.
    :param float init_scale: initial posterior standard deviation (all entries).
    :param loc: optional ``(S, D)`` initial posterior means (overrides the random ones).
    :param scale: optional ``(S, D)`` initial posterior standard deviations, positive.
    :param emission: optional ``(S, T)`` row-stochastic initial emission; default uniform.
    :param seed: seed of the random initial means (None: drawn from torch's global generator).

    Parameters: ``guide.loc``, ``guide.scale`` (the posterior, in the submodule ``guide``) and
    ``emission_logits`` (``emission`` is their row softmax). ``named_parameters()`` reports
    ``guide.loc``, ``guide.scale_unconstrained`` (the scale is positive: Pyro stores its softplus
    inverse, and ``head.guide.scale`` reads the constrained value) and ``emission_logits``. Example::

        >>> import pyro
        >>> from pyro.infer import TraceEnum_ELBO
        >>> from pyro_multihop.data import transitive_task
        >>> from pyro_multihop.models.tied import TiedEmbeddingAttention
        >>> obs = transitive_task(100, num_symbols=18, pairs=3, seed=0)
        >>> head = TiedEmbeddingAttention(18, 8, 18, seed=0)
        >>> elbo = TraceEnum_ELBO(max_plate_nesting=1)
        >>> loss = elbo.differentiable_loss(head.model, head.guide, obs, **head.svi_kwargs(step=0))
        >>> mean, scale = head.embeddings()
        >>> mean.shape, float(scale.max()) < 0.11
        (torch.Size([18, 8]), True)
    """

    def __init__(
        self,
        num_symbols: int,
        embed_dim: int,
        num_targets: int,
        n_hops: int = 2,
        sigma2: float = 0.3,
        *,
        annealing=None,
        plug_in: str = "expected",
        init_loc_scale: float = 0.1,
        init_scale: float = 0.1,
        loc=None,
        scale=None,
        emission=None,
        seed: Optional[int] = None,
    ):
        super().__init__()
        self.num_symbols = check_positive_int("num_symbols", num_symbols)
        self.embed_dim = check_positive_int("embed_dim", embed_dim)
        self.num_targets = check_positive_int("num_targets", num_targets)
        self.n_hops = check_positive_int("n_hops", n_hops)
        self.sigma2 = check_sigma2(sigma2)
        self.annealing: AnnealingSchedule = make_schedule(annealing)
        if plug_in not in PLUG_IN_RULES:
            raise ValueError(f"plug_in must be one of {PLUG_IN_RULES}, got {plug_in!r}")
        self.plug_in = plug_in
        self.init_loc_scale = check_number("init_loc_scale", init_loc_scale)
        self.init_scale = check_number("init_scale", init_scale, strict=True)
        self.seed = None if seed is None else int(seed)
        shape = (num_symbols, embed_dim)
        loc = _initial_tensor("loc", loc, shape) if loc is not None else None
        dtype = loc.dtype if loc is not None else torch.get_default_dtype()
        if loc is None:
            generator = torch.Generator()
            generator.manual_seed(int(torch.randint(2**62, ()).item()) if seed is None else int(seed))
            loc = self.init_loc_scale * torch.randn(shape, generator=generator, dtype=dtype)
        if scale is None:
            scale = torch.full(shape, self.init_scale, dtype=dtype)
        else:
            scale = _initial_tensor("scale", scale, shape).to(dtype)
            if (scale <= 0).any():
                raise ValueError("scale must be positive (posterior standard deviations)")
        if emission is None:
            emission_logits = torch.zeros(num_symbols, num_targets, dtype=dtype)
        else:
            emission_logits = emission_to_logits(emission, (num_symbols, num_targets)).to(dtype)
        self.guide = MeanFieldNormalGuide("embeddings", loc, scale)
        # Buffers, not parameters: the prior's location and scale (dtype and device follow the module).
        self.register_buffer("prior_loc", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("prior_scale", torch.ones(shape, dtype=dtype), persistent=False)
        self.emission_logits = torch.nn.Parameter(emission_logits)  # unconstrained: named "emission_logits"

    # -- parameters ------------------------------------------------------------------------------------
    @property
    def emission(self) -> torch.Tensor:
        """``(S, T)`` target distribution of each value symbol, rows on the simplex."""
        return self.emission_logits.softmax(-1)

    def embeddings(self) -> SymbolEmbeddings:
        """Posterior ``(mean, scale)`` of the embeddings, each ``(S, D)``, detached copies: a
        :class:`~pyro_multihop.embeddings.SymbolEmbeddings`, as the facts head's ``embeddings()``."""
        return SymbolEmbeddings(self.guide.loc.detach().clone(), self.guide.scale.detach().clone())

    def sample_embeddings(self, num_samples: int, seed: Optional[int] = None) -> torch.Tensor:
        """``(num_samples, S, D)`` independent draws from the posterior (no gradient); see ``guide.draw``."""
        return self.guide.draw(num_samples, seed)

    def config(self) -> dict:
        return {
            "num_symbols": self.num_symbols,
            "embed_dim": self.embed_dim,
            "num_targets": self.num_targets,
            "n_hops": self.n_hops,
            "sigma2": self.sigma2,
            "annealing": self.annealing.config(),
            "plug_in": self.plug_in,
            "init_loc_scale": self.init_loc_scale,
            "init_scale": self.init_scale,
            "seed": self.seed,
        }

    # -- SVI -----------------------------------------------------------------------------------------
    def svi_kwargs(self, step: int) -> dict:
        """``{"kl_weight": annealing(step)}``, passed to ``model`` and ``guide`` at SVI step ``step``."""
        return {"kl_weight": self.annealing(step)}

    def svi_defaults(self) -> dict:
        """Settings of ``fit_svi`` when none are given: full-batch Adam at the reference's constant
        ``lr = 0.05`` (no learning-rate decay), 300 steps: the 100-step ramp of the default schedule, then
        200 at the final weight (``docs/tied.md`` measures them against the reference's KL weight)."""
        return {"num_steps": 300, "lr": 0.05, "lr_decay": 1.0, "batch_size": None}

    def prior(self) -> dist.TorchDistribution:
        """``Normal(0, 1)`` over the whole ``(S, D)`` embedding matrix, as one event."""
        return dist.Normal(self.prior_loc, self.prior_scale).to_event(2)

    @pyro_method
    @config_enumerate
    def model(self, obs: Observations, subsample_size: Optional[int] = None, kl_weight=1.0) -> None:
        """Enumerated model: site ``embeddings`` (S, D) under ``scale_kl(kl_weight)``, plate ``observations``
        (dim -1) over ``n``, hop sites ``z_1..z_L``, observed ``target``.

        :param obs: the observations; symbols are checked against the model sizes first.
        :param subsample_size: mini-batch size; the likelihood is scaled to the full data, the KL is not.
        :param kl_weight: weight of the KL term, ``>= 0`` (1 = the plain ELBO).
        """
        self.check_observations(obs)
        check_kl_weight(kl_weight)
        log_emission = self.emission_logits.log_softmax(-1)
        with scale_kl(kl_weight):
            embeddings = pyro.sample("embeddings", self.prior())
        distances = squared_distances(embeddings)  # (S, S), shared by every hop
        with pyro.plate("observations", len(obs), subsample_size=subsample_size, dim=-1) as index:
            batch = obs if subsample_size is None or subsample_size >= len(obs) else obs[index]

            def gate_logits(hop, query):
                return embedding_gate_logits(distances, batch.keys, query, batch.mask, self.sigma2)

            sample_hop_path(gate_logits, self.n_hops, batch.query, batch.values, log_emission, batch.target)

    @pyro_method
    def collapsed_model(self, obs: Observations, subsample_size: Optional[int] = None, kl_weight=1.0) -> None:
        """:meth:`model` with the hop path summed out by the engine: site ``embeddings`` under
        ``scale_kl(kl_weight)``, then ``target ~ CollapsedHopChain`` in the plate ``observations``. Same guide,
        same loss and gradient for a given draw of the embeddings, no enumerated sites (``Trace_ELBO``). Under
        ``Trace_ELBO(num_particles=K, vectorize_particles=True)`` the draw is ``(K, 1, S, D)`` and the target
        site's batch shape ``(K, n)``."""
        self.check_observations(obs)
        check_kl_weight(kl_weight)
        with scale_kl(kl_weight):
            embeddings = pyro.sample("embeddings", self.prior())
        factors = embedding_hop_factors(embeddings, self.log_emission, self.sigma2, self.n_hops)
        with pyro.plate("observations", len(obs), subsample_size=subsample_size, dim=-1) as index:
            batch = obs if subsample_size is None or subsample_size >= len(obs) else obs[index]
            pyro.sample("target", CollapsedHopChain(factors, batch), obs=batch.target)

    # ``guide`` is the submodule MeanFieldNormalGuide: guide(obs, subsample_size=None, kl_weight=1.0) draws
    # "embeddings" under the same scale_kl(kl_weight) and ignores the model's other arguments.

    # -- plug-in inference ------------------------------------------------------------------------------
    def gate_score_tables(self, embeddings: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(L, S, S)``: ``scores[l, q, k] = -||e_q - e_k||^2 / 2 sigma2`` (the same table at every hop), at
        ``embeddings`` (``(S, D)``); by default the plug-in table ``-plug_in_distances() / 2 sigma2``."""
        if embeddings is not None:
            return embedding_score_tables(embeddings, self.sigma2, self.n_hops)
        distances = plug_in_distances(self.guide.loc, self.guide.scale, self.plug_in)
        return (distances / (-2.0 * self.sigma2)).expand(self.n_hops, -1, -1)

    def hop_chain(self, obs: Observations, embeddings: Optional[torch.Tensor] = None) -> HopChain:
        """Gate factors at ``embeddings`` (``(S, D)``; default the plug-in table)."""
        return engine.chain_from_scores(self.gate_score_tables(embeddings), obs)

    def hop_factors(self, embeddings: Optional[torch.Tensor] = None) -> engine.HopFactors:
        """The engine's view of the head at ``embeddings`` (default the plug-in table)."""
        return _score_hop_factors(self.gate_score_tables(embeddings), self.log_emission, self.n_hops)

    def predict_proba(self, keys, values=None, query=None, mask=None, *, num_samples: Optional[int] = None,
                      seed: Optional[int] = None, budget: Optional[int] = None) -> torch.Tensor:
        """``(n, T)`` predictive target distribution, the hop latents marginalised.

        Takes ``(keys (n, N), values (n, N), query (n,), mask=None)`` or an :class:`Observations`.

        :param num_samples: None: the plug-in rule (``plug_in``). ``M``: the Monte-Carlo posterior predictive,
            the average of the predictive over ``M`` posterior draws (:meth:`sample_embeddings`).
        :param seed: seed of those draws.
        """
        if num_samples is None:
            return super().predict_proba(keys, values, query, mask, budget=budget)
        obs = self._context(keys, values, query, mask)
        draws = self.sample_embeddings(num_samples, seed)
        total = 0.0
        for embeddings in draws:
            total = total + engine.predict_proba(self.hop_factors(embeddings), obs, budget)
        return total / num_samples

    # -- generative sampler -----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, n: int, context_len: int = 6, seed: Optional[int] = None, embeddings: str = "posterior"):
        """Draw ``n`` observations from the generative story with the fitted posterior.

        Context keys, values and the query are uniform over the ``S`` symbols. ``embeddings="posterior"``
        draws one embedding matrix from the posterior for the whole batch (the embeddings are a global
        latent: this is the posterior predictive); ``"plug_in"`` uses the plug-in table, so that the
        frequencies follow :meth:`predict_proba`; ``"mean"`` uses the posterior means.
        """
        check_positive_int("n", n)
        check_positive_int("context_len", context_len)
        if embeddings not in ("posterior", "plug_in", "mean"):
            raise ValueError(f"embeddings must be 'posterior', 'plug_in' or 'mean', got {embeddings!r}")
        generator, context = self._random_context(n, context_len, seed)
        loc, scale = self.guide.loc, self.guide.scale
        draw = None if embeddings == "plug_in" else loc
        if embeddings == "posterior":
            draw = loc + scale * torch.randn(loc.shape, generator=generator, dtype=loc.dtype)
        return self._sample_targets(context, self.hop_factors(draw), generator)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", embed_dim={self.embed_dim}, sigma2={self.sigma2}, "
                f"annealing={self.annealing!r}, plug_in={self.plug_in!r}")


def _initial_tensor(name: str, value, shape) -> torch.Tensor:
    tensor = torch.as_tensor(value)
    if not tensor.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {tensor.dtype}")
    if tensor.shape != shape:
        raise ValueError(f"{name} must have shape (num_symbols, embed_dim) = {shape}, got {tuple(tensor.shape)}")
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite, got a NaN or inf entry")
    return tensor.detach()

