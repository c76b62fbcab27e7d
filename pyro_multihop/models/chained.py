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

from ..data import Observations
from ..gates import table_gather
from ..hop_chain import MASKED_LOGIT
from .base import HopAttentionHead, check_positive_int, check_sigma2, emission_to_logits, sample_hop_path

__all__ = ["ChainedAttention", "onehot_gate_logits"]


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
    :param mask: ``(*batch, N)`` bool or None; padding gets :data:`~pyro_multihop.hop_chain.MASKED_LOGIT`.
    :returns: ``(*batch, N)``.
    """
    # ||onehot(v) - K[k]||^2 = 1 - 2 K[k, v] + ||K[k]||^2; the 1 drops out of the softmax. The (S, S) score
    # table is formed first, so the (*batch, N) gate is a single gather.
    scores = (2.0 * key_table - key_table.pow(2).sum(-1, keepdim=True)) / (2.0 * sigma2)
    logits = table_gather(scores, keys, query.unsqueeze(-1))
    return logits if mask is None else logits.masked_fill(~mask, MASKED_LOGIT)


class ChainedAttention(HopAttentionHead):
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
        # PyroParam would store them as "key_tables_unconstrained"); see docs/parameter_names.md.
        self.key_tables = torch.nn.Parameter(key_tables.detach().clone())
        self.emission_logits = torch.nn.Parameter(emission_logits)

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

            sample_hop_path(gate_logits, self.n_hops, batch.query, batch.values, log_emission, batch.target)

    @pyro_method
    def guide(self, obs: Observations, subsample_size: Optional[int] = None) -> None:
        """The empty guide: every latent is enumerated, so the ELBO is the exact log-likelihood."""

    def extra_repr(self) -> str:
        return super().extra_repr() + f", sigma2={self.sigma2}"


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
