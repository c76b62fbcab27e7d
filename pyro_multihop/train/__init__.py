"""Stochastic variational inference for every head of the library: :func:`~pyro_multihop.fit_svi`.

``fit_svi`` minimises the per-observation negative ELBO of ``model.model`` / ``model.guide`` (with the
hop latents enumerated by ``TraceEnum_ELBO``, this is the exact negative log-likelihood for the chained
head) with :class:`pyro.optim.clipped_adam.ClippedAdam`, a torch optimiser with element-wise gradient
clipping and a per-step learning-rate decay. Pyro parameters are read from an isolated param store
(``pyro.get_param_store().scope()``), so two heads never share parameters through the global store.

Settings come, in this order, from the keyword arguments of :func:`~pyro_multihop.fit_svi`, from the head's
``svi_defaults()`` (if it has one) and from :data:`~pyro_multihop.train.settings.SVI_DEFAULTS`:

==========================  ======================================================================
``num_steps``               optimisation steps
``lr``                      initial learning rate of ClippedAdam
``lr_decay``                learning rate after ``num_steps`` steps / initial one (geometric decay)
``batch_size``              mini-batch size (``pyro.plate`` subsampling, likelihood scaled to the
                            full data); None = the full data every step (exact gradient)
``clip_norm``               ClippedAdam's element-wise clip of the per-observation gradient
``betas``                   Adam's moment decay rates
``weight_decay``            L2 penalty on the per-observation loss, a float for every parameter or
                            ``{parameter name: float}`` (names as in ``model.named_parameters()``;
                            a constrained parameter such as ``guide.scale`` also by its name
                            without Pyro's ``_unconstrained`` suffix); a Gaussian prior of precision
                            ``n * weight_decay`` on those parameters
``log_every``               steps between rows of the returned metrics
``divergence_threshold``    nats per observation above the best full-data loss that count as a
                            divergence (``math.inf`` disables the guard)
``divergence_lr_factor``    learning-rate factor applied after a divergence
``divergence_warmup``       steps at the start during which a rise of the loss is no divergence
                            (Adam's early rise at a large learning rate); the guard's reference
                            restarts after them
``init_scale``              with ``starts=K``: standard deviation of the noise added to every
                            parameter of starts 1..K-1
==========================  ======================================================================

Why the chained head's defaults (:meth:`ChainedAttention.svi_defaults
<pyro_multihop.models.ChainedAttention.svi_defaults>`) carry a weight decay on the key tables: the
gate logit ``(2 K[k, v] - ||K[k]||^2) / 2 sigma2`` is quadratic in the key table, and on data the exact
negative log-likelihood keeps falling as the tables grow (sharper gates than ``sigma2`` allows), so it has
no finite minimiser. Adam, whose steps do not shrink with the gradient, then drifts along that direction
into ever higher curvature until a step overshoots (the late divergence of plain Adam), and near zero
tables it turns the noise-level gradient of the first hop into full-size random steps (the
attend-everywhere saddle). The penalty (a Gaussian prior, precision ``n * weight_decay``) gives the loss a
finite minimum, pulls noise-level coordinates back to zero instead, and keeps the pair-specific entries
that would memorise symbol collisions small. ``benchmarks/svi_stability.py`` measures it.

The divergence guard (:mod:`~pyro_multihop.train.divergence_guard`) restores the best parameters and lowers
the learning rate when the full-data loss rises more than ``divergence_threshold`` above its best, after a
warm-up of ``divergence_warmup`` steps. A run that did not get going (the guard fired more than once, or the
loss ended near its step-0 value) warns :class:`~pyro_multihop.diagnostics.TrainingStuckWarning`
(:mod:`~pyro_multihop.train.stuck`). ``fit_svi(..., starts=K)`` fits K starts and keeps the one with the
best held-out log-likelihood (:mod:`~pyro_multihop.train.multistart`).

The modules:

- :mod:`~pyro_multihop.train.settings`: :data:`~pyro_multihop.train.settings.SVI_DEFAULTS`,
  :func:`~pyro_multihop.train.settings.svi_settings` and the optimiser;
- :mod:`~pyro_multihop.train.svi_loss`: the loss (shard scaling, length groups);
  :mod:`~pyro_multihop.train.jit_fields`: how a traced loss sees the data;
- :mod:`~pyro_multihop.train.divergence_guard`: the divergence guard; :mod:`~pyro_multihop.train.stuck`:
  when a run is stuck;
- :mod:`~pyro_multihop.train.interrupts`: SIGINT and SIGTERM, :class:`~pyro_multihop.TrainingInterrupted`;
  :mod:`~pyro_multihop.train.random_state`: the random state a run forks, saves and restores;
- :mod:`~pyro_multihop.train.validation`: held-out data, early stopping, :class:`~pyro_multihop.OverfittingWarning`;
- :mod:`~pyro_multihop.train.svi_run`: the loop, its checkpoint and the resume;
  :mod:`~pyro_multihop.train.fit`: :func:`~pyro_multihop.fit_svi`, which starts it;
- :mod:`~pyro_multihop.train.multistart`: several starts, one answer
  (:func:`~pyro_multihop.train.multistart.fit_svi_starts`).
"""

from .fit import fit_svi
from .interrupts import TrainingInterrupted
from .jit_fields import JitFields
from .multistart import STARTS_VAL_FRACTION, fit_svi_starts
from .settings import SVI_DEFAULTS, svi_settings
from .validation import OVERFITTING_TOLERANCE, OverfittingWarning, split_validation

__all__ = ["SVI_DEFAULTS", "OVERFITTING_TOLERANCE", "STARTS_VAL_FRACTION", "JitFields", "OverfittingWarning",
           "TrainingInterrupted", "fit_svi", "fit_svi_starts", "split_validation", "svi_settings"]
