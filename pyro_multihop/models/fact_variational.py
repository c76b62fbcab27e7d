"""The structured-facts head's symbol embedding ``E`` as a point estimate or as a latent with a mean-field posterior:
the variational multi-hop attention of the tied head, carried over to facts.

:class:`~pyro_multihop.models.facts.FactAttention` with ``embed_dim=D`` reads every symbol through one ``(S, D)``
matrix ``E`` (:mod:`.symbol_embedding`). ``embedding_posterior`` says what ``E`` is:

- ``"point"`` (the default): a parameter, ``symbol_embedding``, fitted by (penalised) maximum likelihood; the
  ELBO is the exact log-likelihood, as for every head without a continuous latent.
- ``"mean_field"``: a latent, as the tied head's embeddings::

      e_s ~ Normal(0, I_D)                      for s = 1..S: one site "symbol_embedding" (S, D), outside the plate
      (the padding row of E stays 0, outside the site)
      for each row: z_1..z_L, target | E         as in the point model (the hop latents enumerated or summed out)

  guided by :class:`~pyro_multihop.guides.MeanFieldNormalGuide` (the submodule ``embedding_guide``: parameters
  ``embedding_guide.loc`` and ``embedding_guide.scale_unconstrained``), with the KL term annealed as the tied head
  anneals it: :func:`~pyro_multihop.guides.scale_kl` wraps the embedding site in the model and in the guide, with
  the weight ``head.svi_kwargs(step)["kl_weight"]`` of ``annealing`` (an
  :class:`~pyro_multihop.guides.AnnealingSchedule`; default ``LinearAnnealing()``, the tied head's). The loss of a
  draw ``e ~ q`` is ``-sum_rows log p(target | e) - w (log p(e) - log q(e))``, whose expectation is the annealed
  negative ELBO ``-E_q[log-likelihood] + w KL(q || p)``.

Plug-in rule: the queries (``log_likelihood``, ``evaluate``, ``predict_proba``, ``posterior``, ...) read ``E`` at the
posterior means, the tied head's ``plug_in="mean"``. (The bilinear terms ``e_q^T Q e_s`` have the mean's value as their
posterior expectation for two different symbols; the tied head's ``"expected"`` distances have no counterpart
through the emission's softmax.) :meth:`EmbeddingPosterior.posterior_predictive` averages the predictive over draws
of the posterior instead.

Symbols without a row of their own: ``embedded_symbols`` (a bool buffer ``(S,)``, all True by default) marks the
symbols that own a row of ``E``; the others' rows are 0 at the start, in every read of ``E`` (a draw included) and
so in every gradient. Such a symbol enters the scores only through the equality terms, the copy and its ``O(S)``
vectors, as a symbol training never showed does. ``pyro-multihop qa --embed-dim`` gives a row only to the symbols
of at least ``--embed-min-count`` training questions (:func:`.symbol_embedding.frequent_symbols`): an entity seen
in one or two questions cannot teach a rule, only a memory of those questions (docs/facts.md, "A knowledge base").

``head.embeddings()`` gives ``E`` as :class:`~pyro_multihop.embeddings.SymbolEmbeddings` (``mean``, and ``scale`` or
None) for every head that has one, the tied head included, so that :mod:`pyro_multihop.embeddings` (alignment,
projection, plots) and :func:`~pyro_multihop.diagnostics.diagnose_fit` read both heads alike.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from pyro.nn import pyro_method

from .. import engine
from ..checks import check_symbol_mask
from ..embeddings import SymbolEmbeddings
from ..guides.annealing import AnnealingSchedule, check_kl_weight, make_schedule, scale_kl
from ..guides.mean_field import MeanFieldNormalGuide

__all__ = ["EMBEDDING_POSTERIORS", "EMBEDDING_SITE", "EMBEDDED_SYMBOLS", "INIT_SCALE_KEY", "EmbeddingPosterior"]

#: What the facts head's ``E`` can be: a point estimate, or a latent with a mean-field normal posterior.
EMBEDDING_POSTERIORS = ("point", "mean_field")

#: The Pyro sample site of ``E`` (mean-field), named as the point estimate's parameter.
EMBEDDING_SITE = "symbol_embedding"

#: The buffer ``(S,)`` bool of an embedded head: which symbols own a row of ``E`` (the others' rows are 0).
EMBEDDED_SYMBOLS = "embedded_symbols"

#: The ``init`` key of the mean-field posterior's initial standard deviations ``(S, D)``.
INIT_SCALE_KEY = "symbol_embedding_scale"


class EmbeddingPosterior:
    """What :class:`~pyro_multihop.models.facts.FactAttention` does with its embedding ``E`` (see the module
    docstring): the constructor's checks, the Pyro site and guide of the mean-field posterior, the SVI hooks
    (``svi_kwargs``, ``guide``) and the read of ``E`` every term goes through (:meth:`embedding_matrix`)."""

    embed_dim: Optional[int]
    embedding_posterior: str
    annealing: Optional[AnnealingSchedule]

    def _posterior_options(self, embedding_posterior, annealing, init: dict) -> Optional[torch.Tensor]:
        """Check the options (``ValueError`` naming the field), set ``embedding_posterior`` and ``annealing``, and
        return the initial standard deviations popped from ``init`` (None: the default)."""
        if embedding_posterior not in EMBEDDING_POSTERIORS:
            raise ValueError(f"embedding_posterior must be one of {EMBEDDING_POSTERIORS}, got {embedding_posterior!r}")
        variational = embedding_posterior == "mean_field"
        if variational and self.embed_dim is None:
            raise ValueError("embedding_posterior='mean_field' needs embed_dim: a table head has no symbol embedding")
        if annealing is not None and not variational:
            raise ValueError("annealing needs embedding_posterior='mean_field' (a point estimate has no KL term)")
        scale = init.pop(INIT_SCALE_KEY, None)
        if scale is not None and not variational:
            raise ValueError(f"init[{INIT_SCALE_KEY!r}] needs embedding_posterior='mean_field'")
        self.embedding_posterior = embedding_posterior
        self.annealing = make_schedule(annealing) if variational else None
        self._fixed_embedding = None
        return scale

    def _embedded_symbols_option(self, embedded_symbols, num_symbols: int) -> None:
        """Check ``embedded_symbols`` (``TypeError``/``ValueError`` naming it) and register it as the buffer
        :data:`EMBEDDED_SYMBOLS` ``(S,)`` bool of an embedded head (None: every symbol owns a row)."""
        if self.embed_dim is None:
            if embedded_symbols is not None:
                raise ValueError("embedded_symbols needs embed_dim: a table head has no symbol embedding")
            return
        mask = torch.ones(num_symbols, dtype=torch.bool) if embedded_symbols is None else \
            check_symbol_mask("embedded_symbols", embedded_symbols, num_symbols)
        self.register_buffer(EMBEDDED_SYMBOLS, mask)

    def _without_own_rows(self, embedding: torch.Tensor) -> torch.Tensor:
        """``embedding`` ``(S, D)`` with the rows of the symbols that own none at 0 (itself where all own one)."""
        owns = getattr(self, EMBEDDED_SYMBOLS, None)
        if owns is None or bool(owns.all()):
            return embedding
        return embedding * owns.unsqueeze(-1).to(embedding.dtype)

    def _set_parameter(self, name: str, value: torch.Tensor, scale: Optional[torch.Tensor]) -> None:
        """Register a parameter; under a mean-field posterior, ``symbol_embedding``'s initial value becomes the
        posterior's means, with standard deviations ``scale`` (default a tenth of the start's, ``0.1 / sqrt(D)``)."""
        if name == EMBEDDING_SITE:
            value = self._without_own_rows(value)
        if name != EMBEDDING_SITE or self.embedding_posterior == "point":
            setattr(self, name, torch.nn.Parameter(value))
            return
        if scale is None:
            scale = torch.full_like(value, 0.1 / self.embed_dim ** 0.5)
        scale = torch.as_tensor(scale, dtype=value.dtype)
        if scale.shape != value.shape:
            raise ValueError(f"init[{INIT_SCALE_KEY!r}] must have shape (S, D) = {tuple(value.shape)}, got "
                             f"{tuple(scale.shape)}")
        self.embedding_guide = MeanFieldNormalGuide(EMBEDDING_SITE, value, scale)
        self.register_buffer("prior_loc", torch.zeros_like(value), persistent=False)
        self.register_buffer("prior_scale", torch.ones_like(value), persistent=False)

    def _posterior_config(self) -> dict:
        """The configuration's entries of the posterior: none for a point estimate (its checkpoints as before)."""
        if self.embedding_posterior == "point":
            return {}
        return {"embedding_posterior": self.embedding_posterior, "annealing": self.annealing.config()}

    # -- E ---------------------------------------------------------------------------------------------------
    def embedding_matrix(self) -> torch.Tensor:
        """``(S, D)`` the ``E`` every term reads: a draw inside :meth:`fixed_embedding` (the model's), else the point
        estimate or the posterior means (the plug-in rule); the rows of symbols without one of their own at 0."""
        if self._fixed_embedding is not None:
            return self._without_own_rows(self._fixed_embedding)
        if self.embedding_posterior == "mean_field":
            return self._without_own_rows(self.embedding_guide.loc)
        return self._without_own_rows(self.symbol_embedding)

    @contextlib.contextmanager
    def fixed_embedding(self, embedding: torch.Tensor):
        """Inside: every term (and every query) reads ``E = embedding`` ``(S, D)``, e.g. a posterior draw."""
        if self.embed_dim is None:
            raise TypeError("a table head (embed_dim=None) has no symbol embedding to fix")
        previous, self._fixed_embedding = self._fixed_embedding, embedding
        try:
            yield embedding
        finally:
            self._fixed_embedding = previous

    def _at_this_embedding(self, function):
        """``function`` bound to the ``E`` fixed now (unchanged where none is): the engine calls a head's factors
        lazily, e.g. when Pyro scores ``CollapsedHopChain`` after the model has left :meth:`drawn_embedding`."""
        embedding = self._fixed_embedding
        if embedding is None:
            return function

        def bound(*args, **kwargs):
            with self.fixed_embedding(embedding):
                return function(*args, **kwargs)
        return bound

    def embeddings(self) -> Optional[SymbolEmbeddings]:
        """``E`` as :class:`~pyro_multihop.embeddings.SymbolEmbeddings`, detached copies: the point estimate (scale
        None) or the posterior's means and standard deviations (a symbol without a row of its own: mean 0); None for
        a table head."""
        if self.embed_dim is None:
            return None
        if self.embedding_posterior == "point":
            return SymbolEmbeddings(self._without_own_rows(self.symbol_embedding).detach().clone())
        return SymbolEmbeddings(self._without_own_rows(self.embedding_guide.loc).detach().clone(),
                                self.embedding_guide.scale.detach().clone())

    def prior(self) -> dist.TorchDistribution:
        """``Normal(0, 1)`` over the whole ``(S, D)`` embedding, one event (mean-field only)."""
        return dist.Normal(self.prior_loc, self.prior_scale).to_event(2)

    # -- SVI ---------------------------------------------------------------------------------------------------
    def svi_kwargs(self, step: int) -> dict:
        """``{"kl_weight": annealing(step)}`` under a mean-field posterior; none for a point estimate."""
        return {} if self.annealing is None else {"kl_weight": self.annealing(step)}

    def _posterior_decay(self, decay: dict) -> dict:
        """The weight decay of ``svi_defaults``, its ``symbol_embedding`` entry moved to the posterior's means
        (the annealed prior adds its pull on top; the point estimate's defaults are kept for the means)."""
        if self.embedding_posterior == "point" or EMBEDDING_SITE not in decay:
            return decay
        decay = dict(decay)
        decay["embedding_guide.loc"] = decay.pop(EMBEDDING_SITE)
        return decay

    @contextlib.contextmanager
    def drawn_embedding(self, kl_weight=1.0):
        """Inside a Pyro model: under a mean-field posterior, the site ``symbol_embedding ~ Normal(0, 1)`` ``(S, D)``
        under ``scale_kl(kl_weight)``, and every term reads that draw; a point estimate draws nothing."""
        if self.embedding_posterior == "point":
            yield None
            return
        check_kl_weight(kl_weight)
        with scale_kl(kl_weight):
            draw = pyro.sample(EMBEDDING_SITE, self.prior())
        with self.fixed_embedding(draw):
            yield draw

    @pyro_method
    def guide(self, obs, subsample_size: Optional[int] = None, kl_weight=1.0) -> None:
        """A point estimate: the empty guide (every latent is enumerated or summed out, so the ELBO is the exact
        log-likelihood). A mean-field posterior: ``embedding_guide`` draws ``symbol_embedding`` under
        ``scale_kl(kl_weight)``."""
        if self.embedding_posterior == "mean_field":
            self.embedding_guide(kl_weight=kl_weight)

    @torch.no_grad()
    def posterior_predictive(self, obs, num_samples: int, seed: Optional[int] = None, *,
                             budget: Optional[int] = None) -> torch.Tensor:
        """``(n, S)`` the predictive averaged over ``num_samples`` draws of ``E`` from the posterior (a point estimate:
        ``predict_proba``)."""
        self.check_observations(obs)
        embeddings = self.embeddings()
        if embeddings is None or embeddings.scale is None:
            return self.predict_proba(obs, budget=budget)
        total = 0.0
        for draw in embeddings.sample(num_samples, seed):
            with self.fixed_embedding(draw):
                total = total + engine.predict_proba(self.hop_factors(), obs, budget)
        return total / num_samples
