"""Stochastic variational inference for every head of the library: :func:`fit_svi`.

``fit_svi`` minimises the per-observation negative ELBO of ``model.model`` / ``model.guide`` (with the
hop latents enumerated by ``TraceEnum_ELBO``, this is the exact negative log-likelihood for the chained
head) with :class:`pyro.optim.clipped_adam.ClippedAdam`, a torch optimiser with element-wise gradient
clipping and a per-step learning-rate decay. Pyro parameters are read from an isolated param store
(``pyro.get_param_store().scope()``), so two heads never share parameters through the global store.

Settings come, in this order, from the keyword arguments of :func:`fit_svi`, from the head's
``svi_defaults()`` (if it has one) and from :data:`SVI_DEFAULTS`:

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

The divergence guard: the full-data loss is tracked (every step with full batches, where it comes for
free; at logged steps with mini-batches); if it rises more than ``divergence_threshold`` above the best
value seen, the best parameters are restored, Adam's moment estimates are reset and the learning rate is
multiplied by ``divergence_lr_factor``. At the end the best parameters are restored if the final ones are
worse. Events are listed in ``metrics.attrs["divergences"]``. The best value is only compared among steps
whose ``model.svi_kwargs(step)`` agree (a KL-annealed objective changes every step while it anneals).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import signal
import threading
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional, Union

import pandas as pd
import pyro
import torch
from pyro.infer import JitTrace_ELBO, JitTraceEnum_ELBO, Trace_ELBO, TraceEnum_ELBO
from pyro.optim.clipped_adam import ClippedAdam
from pyro import poutine

from . import distributed
from .checkpoint import CheckpointError, load_parameters, read_checkpoint, save_checkpoint
from .diagnostics import HeldOutDeclineWarning, diagnose_fit
from .runs import BEST_CHECKPOINT_NAME, progress_bar

__all__ = ["SVI_DEFAULTS", "OverfittingWarning", "TrainingInterrupted", "fit_svi", "split_validation", "svi_settings"]

logger = logging.getLogger(__name__)

#: Library-wide SVI settings; a head's ``svi_defaults()`` overrides them, ``fit_svi``'s arguments override both.
SVI_DEFAULTS = {
    "num_steps": 1000,
    "lr": 0.05,
    "lr_decay": 1.0,
    "batch_size": None,
    "clip_norm": 10.0,
    "betas": (0.9, 0.999),
    "weight_decay": 0.0,
    "log_every": 10,
    "divergence_threshold": 0.25,
    "divergence_lr_factor": 0.5,
}


def _head_defaults(model) -> dict:
    method = getattr(model, "svi_defaults", None)
    return dict(method() or {}) if method is not None else {}


def svi_settings(model, **overrides) -> dict:
    """The settings :func:`fit_svi` would use for ``model``: ``SVI_DEFAULTS``, then ``model.svi_defaults()``,
    then the ``overrides`` that are not None. Raises ``ValueError`` naming an unknown or invalid setting."""
    settings = dict(SVI_DEFAULTS)
    head_defaults = _head_defaults(model)
    for source, values in (("svi_defaults()", head_defaults), ("fit_svi", overrides)):
        unknown = sorted(set(values) - set(SVI_DEFAULTS))
        if unknown:
            raise ValueError(f"{source} has unknown SVI settings {unknown}; known are {sorted(SVI_DEFAULTS)}")
    settings.update(head_defaults)
    settings.update({k: v for k, v in overrides.items() if v is not None})
    _check_settings(settings)
    return settings


def _check_settings(s: dict) -> None:
    for name in ("num_steps", "log_every"):
        value = s[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if s["batch_size"] is not None and (
        isinstance(s["batch_size"], bool) or not isinstance(s["batch_size"], int) or s["batch_size"] < 1
    ):
        raise ValueError(f"batch_size must be a positive integer or None, got {s['batch_size']!r}")
    for name in ("lr", "clip_norm"):
        if not _positive_finite(s[name]):
            raise ValueError(f"{name} must be a positive finite number, got {s[name]!r}")
    for name in ("lr_decay", "divergence_lr_factor"):
        if not _positive_finite(s[name]) or s[name] > 1:
            raise ValueError(f"{name} must be in (0, 1], got {s[name]!r}")
    threshold = s["divergence_threshold"]
    if threshold is not None and not (_positive_finite(threshold) or threshold == math.inf):
        raise ValueError(f"divergence_threshold must be a positive number (math.inf: no guard), got {threshold!r}")
    betas = s["betas"]
    if len(tuple(betas)) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    decay = s["weight_decay"]
    values = decay.values() if isinstance(decay, dict) else [decay]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"weight_decay must be a non-negative number or a dict of them, got {decay!r}")


def _positive_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# -- the optimiser ---------------------------------------------------------------------------------------
def _parameter_groups(model, weight_decay) -> list:
    named = list(model.named_parameters())
    if not named:
        raise ValueError(f"model {type(model).__name__} has no parameters to fit")
    if not isinstance(weight_decay, dict):
        return [{"params": [p for _, p in named], "weight_decay": float(weight_decay)}]
    short = {name[: -len("_unconstrained")] if name.endswith("_unconstrained") else name: name for name, _ in named}
    unknown = sorted(k for k in weight_decay if k not in short and k not in short.values())
    if unknown:
        raise ValueError(f"weight_decay names unknown parameters {unknown}; the model has {sorted(short)}")
    decay_of = {short.get(k, k): float(v) for k, v in weight_decay.items()}
    groups = defaultdict(list)
    for name, parameter in named:
        groups[decay_of.get(name, 0.0)].append(parameter)
    return [{"params": params, "weight_decay": decay} for decay, params in groups.items()]


def _make_optimizer(model, settings) -> ClippedAdam:
    return ClippedAdam(
        _parameter_groups(model, settings["weight_decay"]),
        lr=settings["lr"],
        betas=tuple(settings["betas"]),
        clip_norm=settings["clip_norm"],
        lrd=settings["lr_decay"] ** (1.0 / settings["num_steps"]),
    )


# -- the loss ----------------------------------------------------------------------------------------------
class _Loss:
    """Per-observation negative ELBO of ``model`` on ``obs``: a training estimate and the full-data value.

    Under a process group ``obs`` is this rank's shard of ``total`` rows (``largest_shard`` in the biggest
    shard): the loss is this shard's share of the loss on the union of the shards, divided by ``total``,
    so that the shares (and their gradients) sum to the single-process loss. Sites inside the observations
    plate keep their plate scale (``shard / batch`` with mini-batches); sites outside every plate, the
    global latents and their KL term, are scaled by ``shard / total``, so that they count once in the sum.

    ``collapsed``: the model is ``model.collapsed_model`` (the hop path summed out by the engine, no
    enumerated site) under ``Trace_ELBO``; otherwise ``model.model`` under ``TraceEnum_ELBO``.

    ``group_lengths``: rows are grouped by context length (rounded up to this many positions) and each group
    is cut to its own width (:class:`_LengthGroups`) before the loss, which sums the groups' shares.
    """

    def __init__(self, model, obs, batch_size: Optional[int], jit: bool,
                 total: Optional[int] = None, largest_shard: Optional[int] = None, collapsed: bool = False,
                 group_lengths: Optional[int] = None):
        self.model = model
        self.obs = obs
        self.n = len(obs) if total is None else int(total)
        largest = len(obs) if largest_shard is None else int(largest_shard)
        self.full_batch = batch_size is None or batch_size >= largest  # the same decision on every rank
        self.subsample_size = None if self.full_batch or batch_size >= len(obs) else batch_size
        self.base_model, self.base_guide = (model.collapsed_model if collapsed else model.model), model.guide
        self.model_fn, self.guide_fn = self.base_model, self.base_guide
        if 0 < len(obs) < self.n:
            share = _GlobalSiteScale(len(obs) / self.n)
            self.model_fn, self.guide_fn = share(self.model_fn), share(model.guide)
        self.exact_elbo = Trace_ELBO() if collapsed else TraceEnum_ELBO(max_plate_nesting=1)
        self.groups = None if group_lengths is None or len(obs) == 0 else _LengthGroups(obs, group_lengths)
        self.jit = jit
        if jit:
            if collapsed:
                self.train_elbo = JitTrace_ELBO(ignore_jit_warnings=True)
            else:
                self.train_elbo = JitTraceEnum_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
            self.fields = JitFields(obs)
            self._jit_model, self._jit_guide = self.fields.wrap(self.model_fn), self.fields.wrap(self.guide_fn)
        else:
            self.train_elbo = self.exact_elbo

    def train(self, step: int) -> torch.Tensor:
        """Differentiable per-observation loss of step ``step`` (a mini-batch estimate with ``batch_size``);
        a constant 0 on an empty shard."""
        if len(self.obs) == 0:
            return torch.zeros(())
        kwargs = dict(self.model.svi_kwargs(step))
        if self.groups is not None:
            rows = None if self.subsample_size is None else torch.randperm(len(self.obs), device=self.obs.device)[: self.subsample_size]
            return self._grouped(self.train_elbo.differentiable_loss, rows, kwargs)
        if self.subsample_size is not None:
            kwargs["subsample_size"] = self.subsample_size
        if not self.jit:
            return self.train_elbo.differentiable_loss(self.model_fn, self.guide_fn, self.obs, **kwargs) / self.n
        args, static = self.fields.arguments(self.obs, kwargs)
        return self.train_elbo.differentiable_loss(self._jit_model, self._jit_guide, *args, **static) / self.n

    @torch.no_grad()
    def full(self, step: int) -> float:
        """Per-observation loss on all of ``obs`` (all shards' under a process group), without gradients."""
        if len(self.obs) == 0:
            return self.reduce(0.0)
        kwargs = self.model.svi_kwargs(step)
        if self.groups is not None:
            return self.reduce(float(self._grouped(self.exact_elbo.loss, None, kwargs)))
        return self.reduce(float(self.exact_elbo.loss(self.model_fn, self.guide_fn, self.obs, **kwargs)) / self.n)

    def _grouped(self, loss_fn, rows, kwargs):
        """Sum over length groups of the loss of ``rows`` (None: all rows of the shard), per observation of the
        whole data: plate sites scaled by ``shard / batch``, global sites by each group's share of them."""
        m = len(self.obs)
        batch = m if rows is None else len(rows)
        total = 0.0
        for group in self.groups.batches(rows):
            # (m / batch) on every site, and global sites by a further group / n: summed over the groups,
            # the global sites count m / n (the shard's share), the plate sites m / batch.
            share = _GlobalSiteScale(len(group) / self.n)
            model_fn = poutine.scale(share(self.base_model), m / batch)
            guide_fn = poutine.scale(share(self.base_guide), m / batch)
            total = total + loss_fn(model_fn, guide_fn, group, **kwargs) / self.n
        return total

    @staticmethod
    def reduce(value: float) -> float:
        """Sum of a loss share over ranks (``value`` itself in one process)."""
        return distributed.all_reduce_sum(value)[0]


class _LengthGroups:
    """Rows grouped by context length (rounded up to ``granularity`` positions), each group cut to its width.

    Exact (padding is never attended) and, where most contexts are much shorter than the longest, several
    times faster: the loss costs ``O(N^2)`` per row (bAbI task 2, mean length 31 of 100 positions: 0.33 s
    against 7.9 s a full-batch step enumerated, 0.20 s against 3.3 s collapsed;
    ``benchmarks/results/length_groups.md``). Needs a data type with ``context_lengths()`` and
    ``truncate_context(width)``."""

    def __init__(self, obs, granularity: int):
        lengths = obs.context_lengths()
        self.obs = obs
        self.width = ((lengths + granularity - 1) // granularity * granularity).clamp(max=obs.context_len)
        self.widths = self.width.unique().tolist()

    def batches(self, rows: Optional[torch.Tensor] = None):
        """The groups of ``rows`` (None: every row), each cut to its width."""
        widths = self.width if rows is None else self.width[rows]
        for width in self.widths:
            chosen = (widths == width).nonzero().squeeze(-1)
            if rows is not None:
                chosen = rows[chosen]
            if len(chosen):
                yield self.obs[chosen].truncate_context(int(width))


class _GlobalSiteScale(poutine.messenger.Messenger):
    """Multiply the scale of every sample site outside all plates by ``scale`` (a shard's share)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["cond_indep_stack"]:
            msg["scale"] = msg["scale"] * self.scale


def _backward(training_loss: torch.Tensor, model) -> None:
    """Gradients of this rank's loss share, summed over ranks: the gradient of the whole data's loss."""
    if training_loss.requires_grad:
        training_loss.backward()
    distributed.all_reduce_gradients(model.parameters())


class JitFields:
    """How ``JitTraceEnum_ELBO`` sees a data object: its constructor's arguments, read from the attributes
    of the same names (tensors, or None for an absent optional one), passed positionally, and the object
    rebuilt from them inside the traced function. Any data class built that way works; one that is not
    raises ``TypeError`` (train it with ``jit=False``)."""

    def __init__(self, obs):
        self.data_type = type(obs)
        try:
            parameters = inspect.signature(self.data_type).parameters.values()
        except (TypeError, ValueError):
            parameters = ()
        names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for name in names:
            value = getattr(obs, name, _MISSING)
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"jit=True needs data whose constructor arguments are tensor attributes of the same names; "
                    f"{self.data_type.__name__}.{name} is {type(value).__name__ if value is not _MISSING else 'missing'} "
                    f"(train with jit=False)"
                )
        if not names:
            raise TypeError(f"jit=True cannot read the constructor arguments of {self.data_type.__name__} (train with jit=False)")
        self.names = tuple(names)

    def arguments(self, obs, kwargs: dict):
        """Split a call: tensors positionally (the data's fields, then the numeric ``svi_kwargs`` as 0-dim
        tensors so that a changing KL weight does not recompile), the rest as hashable keyword arguments."""
        present = tuple(name for name in self.names if getattr(obs, name) is not None)
        args = [getattr(obs, name) for name in present]
        static = {"_fields": present}
        tensor_names = []
        for name, value in sorted(kwargs.items()):
            if isinstance(value, (float, torch.Tensor)) and name != "subsample_size":
                args.append(torch.as_tensor(value, dtype=torch.get_default_dtype(), device=args[0].device))
                tensor_names.append(name)
            else:
                static[name] = value
        static["_tensor_kwargs"] = tuple(tensor_names)
        return args, static

    def wrap(self, fn: Callable) -> Callable:
        data_type = self.data_type

        def call(*args, _fields, _tensor_kwargs, **kwargs):
            obs = data_type(**dict(zip(_fields, args[: len(_fields)])))
            kwargs.update(zip(_tensor_kwargs, args[len(_fields) :]))
            return fn(obs, **kwargs)

        return call


_MISSING = object()


# -- training state that a checkpoint carries -------------------------------------------------------------
def _snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _objective_key(model, step: int) -> str:
    return repr(sorted(model.svi_kwargs(step).items()))


class _Guard:
    """Best full-data loss, best parameters, divergence events."""

    def __init__(self, threshold: Optional[float], lr_factor: float):
        self.threshold = None if threshold is None or threshold == math.inf else float(threshold)
        self.lr_factor = lr_factor
        self.best_loss = math.inf
        self.best_step = None
        self.best_state = None
        self.objective = None
        self.events = []

    def observe(self, step: int, loss: float, objective: str, model) -> bool:
        """Record the full-data ``loss`` after ``step`` steps; True if it is a divergence."""
        if objective != self.objective:
            self.objective, self.best_loss, self.best_step, self.best_state = objective, math.inf, None, None
        if self.best_state is not None and self.threshold is not None:
            if not math.isfinite(loss) or loss > self.best_loss + self.threshold:
                return True
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss is {loss} at step {step}, before any finite value to restore")
        if loss < self.best_loss:
            self.best_loss, self.best_step, self.best_state = loss, step, _snapshot(model)
        return False

    def recover(self, step: int, loss: float, model, optimizer) -> None:
        """Restore the best parameters, reset Adam's moments, lower the learning rate."""
        model.load_state_dict(self.best_state)
        optimizer.state = defaultdict(dict)
        for group in optimizer.param_groups:
            group["lr"] *= self.lr_factor
        event = {
            "step": step,
            "loss": loss,
            "best_loss": self.best_loss,
            "best_step": self.best_step,
            "lr": optimizer.param_groups[0]["lr"],
        }
        self.events.append(event)
        logger.warning(
            "divergence at step %d: loss %.4g > best %.4g (step %d) + %.3g; best parameters restored, lr -> %.3g",
            step, loss, self.best_loss, self.best_step, self.threshold, event["lr"],
        )

    def state(self) -> dict:
        return {
            "best_loss": self.best_loss,
            "best_step": self.best_step,
            "best_state": self.best_state,
            "objective": self.objective,
            "events": list(self.events),
        }

    def load(self, state: dict) -> None:
        self.best_loss = state["best_loss"]
        self.best_step = state["best_step"]
        self.best_state = state["best_state"]
        self.objective = state["objective"]
        self.events = list(state["events"])


def _rng_devices(device: torch.device) -> list:
    return [device.index or 0] if device.type == "cuda" else []


def _get_rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _model_device(model) -> torch.device:
    return next(model.parameters()).device


# -- interrupts ----------------------------------------------------------------------------------------
class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped :func:`fit_svi` after a completed step; the checkpoint holds that step.

    ``signum`` is the signal, ``step`` the steps completed, ``checkpoint`` the file written;
    ``exit_status`` is the conventional ``128 + signum`` (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, step: int, checkpoint):
        super().__init__(f"{signal.Signals(signum).name} after step {step}; checkpoint written to {checkpoint}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_status = 128 + signum


@contextlib.contextmanager
def _deferred_interrupts(enabled: bool):
    """While active, SIGINT and SIGTERM only set a flag (``received[0]`` = the signal number) that the
    training loop checks between steps; a second signal interrupts at once. Only in the main thread,
    where Python delivers signals; the previous handlers are restored on exit."""
    received = [None]
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, frame):
        if received[0] is not None:
            raise KeyboardInterrupt
        received[0] = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _agreed_signal(signum, checkpoint):
    """The signal to stop on: under a process group with a checkpoint, the one any rank received (one small
    all-reduce a step), so that every rank saves and stops at the same step (the save is collective)."""
    if checkpoint is None or not distributed.is_distributed():
        return signum
    return distributed.all_reduce_max(signum or 0) or None


# -- the fit -----------------------------------------------------------------------------------------------
def fit_svi(
    model,
    obs,
    *,
    num_steps: Optional[int] = None,
    lr: Optional[float] = None,
    batch_size: Optional[int] = None,
    val=None,
    val_fraction: Optional[float] = None,
    patience: Optional[int] = None,
    seed: Optional[int] = 0,
    progress: bool = True,
    jit: bool = False,
    callback: Optional[Callable] = None,
    lr_decay: Optional[float] = None,
    clip_norm: Optional[float] = None,
    weight_decay: Union[None, float, dict] = None,
    log_every: Optional[int] = None,
    divergence_threshold: Optional[float] = None,
    checkpoint: Union[None, str, os.PathLike] = None,
    checkpoint_every: Optional[int] = None,
    best_checkpoint: Union[None, str, os.PathLike] = None,
    resume: bool = True,
    collapsed: bool = False,
    group_lengths: Optional[int] = None,
) -> pd.DataFrame:
    """Fit ``model``'s parameters to ``obs`` by SVI on ``TraceEnum_ELBO`` (see the module docstring).

    :param model: a head of this library (``model``, ``guide``, ``svi_kwargs``, ``evaluate``,
        ``check_observations``); fitted in place.
    :param obs: training data of any type the head accepts (``model.check_observations``): it needs ``len``,
        ``.to(device)`` and row indexing (moved to the model's device).
    :param int num_steps: optimisation steps. Settings left None come from ``model.svi_defaults()`` and
        :data:`SVI_DEFAULTS`; so do ``lr``, ``batch_size``, ``lr_decay``, ``clip_norm``, ``weight_decay``,
        ``log_every`` and ``divergence_threshold``.
    :param val: optional held-out data, evaluated (``model.evaluate``) at every logged step.
    :param float val_fraction: instead of ``val``, hold out this share of ``obs`` (rows drawn by ``seed``,
        see :func:`split_validation`) and train on the rest.
    :param int patience: early stopping: stop once the held-out log-likelihood has not improved for this many
        evaluations (logged steps). Needs ``val`` or ``val_fraction``.
    :param seed: seed of the run's random stream (mini-batches, Monte Carlo guides). The caller's global
        torch random state is left as it was. None draws from the global stream instead.
    :param bool progress: show progress on stderr (a bar on a terminal, periodic lines otherwise:
        :func:`pyro_multihop.runs.progress_bar`).
    :param bool jit: use ``JitTraceEnum_ELBO`` (traced once per mini-batch size) for the training loss; the
        data type must be built from tensor attributes of its constructor's argument names.
    :param bool collapsed: train ``model.collapsed_model`` (the hop path summed out by the engine:
        :class:`~pyro_multihop.distributions.CollapsedHopChain`) under ``Trace_ELBO`` instead of the enumerated
        ``model.model`` under ``TraceEnum_ELBO``: the same loss and gradient, several times faster.
    :param int group_lengths: group rows by context length, rounded up to this many positions, and cut each
        group to its width before the loss: exact, and several times faster where most contexts are much
        shorter than the longest (bAbI). Needs data with ``context_lengths()`` and ``truncate_context()``.
    :param callback: ``callback(step, model, row)`` after every logged row; returning True stops the fit.
    :param checkpoint: optional path; the model, optimiser, random and guard state are saved there every
        ``checkpoint_every`` steps and at the end.
    :param int checkpoint_every: steps between checkpoints (default: ``num_steps // 10``).
    :param best_checkpoint: where the parameters of the best held-out log-likelihood are saved whenever it
        improves (default, with ``checkpoint`` and held-out data: ``best.pt`` beside ``checkpoint``).
    :param bool resume: if ``checkpoint`` exists, continue from it: parameters, optimiser state, learning
        rate, random state and guard state are restored, so the result equals that of an uninterrupted run
        (bit for bit without ``jit``; tracing draws from the random stream when it compiles). A finished
        checkpoint is loaded into ``model`` and its metrics are returned without training.
    :raises TrainingInterrupted: with a ``checkpoint``, SIGINT (Ctrl-C) or SIGTERM during the loop lets the
        current step finish, writes the checkpoint at that step and raises this ``KeyboardInterrupt``
        (resuming from it gives the uninterrupted result). A second signal interrupts at once.
    :returns: a DataFrame with one row per logged step: ``step`` (steps taken), ``loss`` (full-data loss
        per observation), ``lr``, ``seconds`` and, with held-out data, ``val_log_likelihood`` and
        ``val_accuracy``. ``attrs`` holds ``settings``, ``best_step``, ``best_loss``, ``final_loss`` (loss
        of the last parameters), ``restored_best``, ``divergences``, ``resumed_from`` and, with held-out
        data, ``best_val`` (``step``, ``log_likelihood``, ``checkpoint``, ``stopped_early``); after a run that
        trained, ``diagnostics`` (the messages of :func:`~pyro_multihop.diagnostics.diagnose_fit` on the head).
    :raises ValueError: on empty data or an invalid setting.
    :warns OverfittingWarning: when the last held-out log-likelihood is clearly below its best.
    :warns PosteriorCollapseWarning: when the head's posterior stays at its prior (the tied head).

    Example::

        >>> from pyro_multihop import ChainedAttention, transitive_task
        >>> from pyro_multihop.train import fit_svi
        >>> head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
        >>> metrics = fit_svi(head, transitive_task(200, seed=0), num_steps=20, progress=False)
        >>> list(metrics.columns)
        ['step', 'loss', 'lr', 'seconds']
    """
    with distributed.agreed():  # a bad shard ends every rank, not only its own
        if not callable(getattr(model, "model", None)) or not callable(getattr(model, "guide", None)):
            raise TypeError(f"model must be a head with model and guide methods, got {type(model).__name__}")
        if not isinstance(collapsed, bool):
            raise TypeError(f"collapsed must be a bool, got {collapsed!r}")
        if collapsed and not callable(getattr(model, "collapsed_model", None)):
            raise TypeError(f"collapsed=True needs a head with a collapsed_model method, got {type(model).__name__}")
        model.check_observations(obs, "obs")
        if val is not None and val_fraction is not None:
            raise ValueError("give val or val_fraction, not both")
        if val_fraction is not None:
            obs, val = split_validation(obs, val_fraction, seed=0 if seed is None else seed)
        if val is not None:
            model.check_observations(val, "val")
        _check_optional_positive("patience", patience)
        _check_optional_positive("checkpoint_every", checkpoint_every)
        _check_optional_positive("group_lengths", group_lengths)
        if patience is not None and val is None:
            raise ValueError("patience needs held-out data: give val or val_fraction")
        if group_lengths is not None:
            if jit:
                raise ValueError("group_lengths and jit=True do not combine (each group has its own width)")
            missing = [m for m in ("context_lengths", "truncate_context") if not callable(getattr(obs, m, None))]
            if missing:
                raise TypeError(f"group_lengths needs data with {' and '.join(missing)}(), got {type(obs).__name__}")
    # Under a process group obs and val are this rank's shards; the counts are those of all shards.
    total, val_total = distributed.all_reduce_sum(len(obs), 1 if val is None else len(val))
    if total == 0:
        raise ValueError("obs must hold at least one observation to fit, got 0")
    if val_total == 0:
        raise ValueError("val must hold at least one observation, got 0")
    settings = svi_settings(
        model,
        num_steps=num_steps,
        lr=lr,
        batch_size=batch_size,
        lr_decay=lr_decay,
        clip_norm=clip_norm,
        weight_decay=weight_decay,
        log_every=log_every,
        divergence_threshold=divergence_threshold,
    )
    device = _model_device(model)
    obs = obs.to(device)
    val = None if val is None else val.to(device)
    if best_checkpoint is None and checkpoint is not None and val is not None:
        best_checkpoint = Path(checkpoint).with_name(BEST_CHECKPOINT_NAME)

    shards = (int(total), distributed.all_reduce_max(len(obs)))
    loss = _Loss(model, obs, settings["batch_size"], jit, *shards, collapsed=collapsed, group_lengths=group_lengths)

    with torch.random.fork_rng(devices=_rng_devices(device), enabled=seed is not None):
        if seed is not None:
            # Full batches: one stream on every rank (global latents drawn alike, the single-process step);
            # mini-batches: each rank its own stream.
            torch.manual_seed(int(seed) if loss.full_batch else distributed.rank_seed(int(seed)))
        with pyro.get_param_store().scope():
            run = _SviRun(model, loss, settings, device, val=val, patience=patience, progress=progress,
                          callback=callback, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                          best_checkpoint=best_checkpoint)
            finished = run.resume() if checkpoint is not None and resume else None
            return finished if finished is not None else run.run()


def split_validation(obs, fraction: float, seed: int = 0):
    """``(train, held_out)``: ``round(fraction * len(obs))`` rows (at least one, and at least one left to train
    on) drawn without replacement by a private generator seeded with ``seed``; both keep the file's order."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"val_fraction must be a number in (0, 1), got {fraction!r}")
    n = len(obs)
    if n < 2:
        raise ValueError(f"val_fraction needs at least 2 observations to split, got {n}")
    n_val = min(max(1, round(fraction * n)), n - 1)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    held_out, kept = order[:n_val].sort().values, order[n_val:].sort().values
    return obs[kept], obs[held_out]


def _check_optional_positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


class OverfittingWarning(HeldOutDeclineWarning):
    """The held-out log-likelihood of the last parameters is clearly below its best during the run (a
    :class:`~pyro_multihop.diagnostics.HeldOutDeclineWarning` that names the best checkpoint)."""


#: Nats per held-out observation below the best that :class:`OverfittingWarning` reports.
OVERFITTING_TOLERANCE = 0.01


class _Validation:
    """Best held-out log-likelihood so far, its step, and evaluations since (for ``patience``)."""

    def __init__(self, patience: Optional[int]):
        self.patience = patience
        self.best_log_likelihood = -math.inf
        self.best_step = None
        self.since_best = 0
        self.stopped_early = False

    def observe(self, step: int, log_likelihood: float) -> bool:
        """Record an evaluation after ``step`` steps; True if it is a new best."""
        if log_likelihood > self.best_log_likelihood:
            self.best_log_likelihood, self.best_step, self.since_best = log_likelihood, step, 0
            return True
        self.since_best += 1
        return False

    @property
    def out_of_patience(self) -> bool:
        return self.patience is not None and self.since_best >= self.patience

    def state(self) -> dict:
        return {"best_log_likelihood": self.best_log_likelihood, "best_step": self.best_step,
                "since_best": self.since_best, "stopped_early": self.stopped_early}

    def load(self, state: dict) -> None:
        self.best_log_likelihood = state["best_log_likelihood"]
        self.best_step = state["best_step"]
        self.since_best = state["since_best"]
        self.stopped_early = state["stopped_early"]


class _SviRun:
    """One SVI run's state: the optimiser, the divergence guard, the metric rows, the held-out record, and
    where the run started (a resumed checkpoint's step) and what it saves.

    :meth:`resume` restores a checkpoint (returning the metrics of a finished one), :meth:`run` takes the
    steps; each step is :meth:`take_step`, each logged row :meth:`log_row`, each save :meth:`save`."""

    def __init__(self, model, loss: _Loss, settings: dict, device, *, val, patience, progress, callback,
                 checkpoint, checkpoint_every, best_checkpoint):
        self.model, self.loss, self.settings, self.device = model, loss, settings, device
        self.val, self.callback, self.progress = val, callback, progress
        self.checkpoint, self.best_checkpoint = checkpoint, best_checkpoint
        self.checkpoint_every = checkpoint_every or max(1, settings["num_steps"] // 10)
        self.optimizer = _make_optimizer(model, settings)
        self.guard = _Guard(settings["divergence_threshold"], settings["divergence_lr_factor"])
        self.validation = None if val is None else _Validation(patience)
        self.rows = []
        self.start = 0
        self.resumed_from = None
        self.elapsed_before = 0.0
        self.started = None
        self.bar = None

    # -- resuming ---------------------------------------------------------------------------------------------
    def resume(self) -> Optional[pd.DataFrame]:
        """Restore the state of ``checkpoint`` if it exists; the metrics if that run had finished, else None."""
        payload = _resume_payload(self.checkpoint)
        if payload is None:
            return None
        training = payload["extra"].get("svi")
        if training is None:
            raise CheckpointError(f"checkpoint {str(self.checkpoint)!r} holds no SVI training state to resume")
        load_parameters(self.model, payload)
        if payload["optimizer"] is not None:
            self.optimizer.load_state_dict(payload["optimizer"])
        self.guard.load(training["guard"])
        if self.validation is not None and training.get("validation") is not None:
            self.validation.load(training["validation"])
        _set_rng_state(_own_rng_state(training, self.checkpoint), self.device)
        self.rows = list(training["rows"])
        self.start = self.resumed_from = int(payload["step"])
        self.elapsed_before = float(training["seconds"])
        logger.info("resuming SVI from %s at step %d", self.checkpoint, self.start)
        if training.get("finished") and self.start >= self.settings["num_steps"]:
            return self.metrics(training["final_loss"], training["restored_best"])
        return None

    # -- one logged row, one save, one step ------------------------------------------------------------------
    def log_row(self, step: int, value: float) -> bool:
        """Append the metrics of ``step`` (evaluating the held-out data); True if the run should stop."""
        row = {"step": step, "loss": value, "lr": self.optimizer.param_groups[0]["lr"]}
        if self.val is not None:
            result = distributed.evaluate(self.model, self.val)
            row["val_log_likelihood"] = result["log_likelihood"]
            row["val_accuracy"] = result["accuracy"]
            if self.validation.observe(step, result["log_likelihood"]) and self.best_checkpoint is not None:
                self.save_best(step, result)
        row["seconds"] = time.perf_counter() - self.started
        self.rows.append(row)
        self.bar.set_postfix(loss=f"{value:.4f}", refresh=False)
        logger.debug("svi step %d: %s", step, row)
        stop = bool(self.callback(step, self.model, dict(row))) if self.callback is not None else False
        if self.validation is not None and self.validation.out_of_patience:
            self.validation.stopped_early = stop = True
        return bool(distributed.all_reduce_max(stop))  # any rank's callback stops every rank

    def save(self, step: int, finished: bool = False, final_loss=None, restored=False) -> None:
        rng = _get_rng_state(self.device)
        training = {
            "guard": self.guard.state(),
            # Under a process group: every rank's random state, by rank, and the number of ranks.
            "rng": distributed.all_gather_objects(rng) if distributed.is_distributed() else rng,
            "world_size": distributed.world_size(),
            "rows": self.rows,
            "seconds": time.perf_counter() - self.started,
            "finished": finished,
            "final_loss": final_loss,
            "restored_best": restored,
            "settings": _json_settings(self.settings),
            "validation": None if self.validation is None else self.validation.state(),
        }
        if distributed.rank() == 0:
            save_checkpoint(self.checkpoint, self.model, self.optimizer, step=step, extra={"svi": training})

    def save_best(self, step: int, result: dict) -> None:
        """The parameters of the best held-out log-likelihood so far, to ``best_checkpoint``."""
        if distributed.rank() == 0:
            best = {"step": step, "val_log_likelihood": result["log_likelihood"], "val_accuracy": result["accuracy"],
                    "chosen_by": "highest held-out log-likelihood"}
            save_checkpoint(self.best_checkpoint, self.model, step=step, extra={"svi_best": best})

    def take_step(self, step: int) -> bool:
        """One optimisation step (or a divergence recovery); True if the run should stop after it."""
        optimizer, loss = self.optimizer, self.loss
        optimizer.zero_grad(set_to_none=True)
        objective = _objective_key(self.model, step)
        training_loss = loss.train(step)
        logged = step % self.settings["log_every"] == 0
        if loss.full_batch:
            full = loss.reduce(float(training_loss.detach()))
        elif logged:
            full = loss.full(step)
        else:
            full = None
        if full is not None and self.guard.observe(step, full, objective, self.model):
            self.guard.recover(step, full, self.model, optimizer)
            return False
        _backward(training_loss, self.model)
        stop = logged and self.log_row(step, full)
        optimizer.step()
        return stop

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        num_steps, checkpoint = self.settings["num_steps"], self.checkpoint
        distributed.broadcast_module(self.model)  # every rank starts from rank 0's parameters
        self.started = time.perf_counter() - self.elapsed_before
        show = self.progress and distributed.rank() == 0
        last = self.start
        with _deferred_interrupts(checkpoint is not None) as received, \
                progress_bar(num_steps, initial=self.start, desc="svi", unit="step", enabled=show) as self.bar:
            for step in range(self.start, num_steps):
                signum = _agreed_signal(received[0], checkpoint)
                if signum is not None:  # steps 0..step-1 are complete: save them and stop
                    self.save(step)
                    raise TrainingInterrupted(signum, step, checkpoint)
                stop = self.take_step(step)
                self.bar.update(1)
                last = step + 1
                if checkpoint is not None and last % self.checkpoint_every == 0 and last < num_steps:
                    self.save(last)
                if stop:
                    break
            final_loss = self.loss.full(last)
            diverged = self.guard.observe(last, final_loss, _objective_key(self.model, last), self.model)
            self.log_row(last, final_loss)
            late_signal = _agreed_signal(received[0], checkpoint)  # arrived after the last step: finish, save, report
        restored = False
        guard = self.guard
        if guard.best_state is not None and (diverged or guard.best_loss < final_loss):
            self.model.load_state_dict(guard.best_state)
            restored = True
            logger.info("restored the best parameters (step %d, loss %.4g; last loss %.4g)", guard.best_step,
                        guard.best_loss, final_loss)
        if checkpoint is not None:
            self.save(last, finished=True, final_loss=final_loss, restored=restored)
        if late_signal is not None:
            raise TrainingInterrupted(late_signal, last, checkpoint)
        metrics = self.metrics(final_loss, restored)
        _warn_if_overfitting(metrics)
        # The head's own checks (posterior collapse of the tied head's embeddings); the held-out decline is
        # OverfittingWarning's, above.
        metrics.attrs["diagnostics"] = [str(d) for d in diagnose_fit(self.model, None, stacklevel=4)]
        return metrics

    def metrics(self, final_loss, restored) -> pd.DataFrame:
        frame = pd.DataFrame(self.rows)
        frame.attrs.update(
            {
                "settings": _json_settings(self.settings),
                "best_step": self.guard.best_step,
                "best_loss": self.guard.best_loss,
                "final_loss": final_loss,
                "restored_best": restored,
                "divergences": list(self.guard.events),
                "resumed_from": self.resumed_from,
            }
        )
        if self.validation is not None:
            frame.attrs["best_val"] = {
                "step": self.validation.best_step,
                "log_likelihood": self.validation.best_log_likelihood,
                "checkpoint": None if self.best_checkpoint is None else str(self.best_checkpoint),
                "stopped_early": self.validation.stopped_early,
            }
        return frame


def _warn_if_overfitting(metrics: pd.DataFrame) -> None:
    """:class:`OverfittingWarning` when the last held-out log-likelihood is more than
    :data:`OVERFITTING_TOLERANCE` below the best one of the run."""
    best = metrics.attrs.get("best_val")
    if best is None or best["step"] is None or "val_log_likelihood" not in metrics.columns:
        return
    last = float(metrics["val_log_likelihood"].iloc[-1])
    if last < best["log_likelihood"] - OVERFITTING_TOLERANCE:
        where = f"kept in {best['checkpoint']}" if best["checkpoint"] else "pass a checkpoint to keep them"
        warnings.warn(
            f"held-out log-likelihood fell from {best['log_likelihood']:.4f} (step {best['step']}) to {last:.4f} "
            f"(step {int(metrics['step'].iloc[-1])}): the fit overfits the training data after its best point; "
            f"use the best parameters ({where}), or try early stopping (patience, --patience) or a stronger "
            "weight decay",
            OverfittingWarning,
            stacklevel=4,  # fit_svi's caller
        )


def _resume_payload(checkpoint):
    """The checkpoint to resume from, or None if there is none; under a process group rank 0 reads it
    and every rank gets its contents (only rank 0 needs the file)."""
    payload = None
    with distributed.agreed():
        if distributed.rank() == 0 and os.path.exists(checkpoint):
            payload = read_checkpoint(checkpoint)
    return distributed.broadcast_object(payload)


def _own_rng_state(training: dict, checkpoint) -> dict:
    saved_world = int(training.get("world_size", 1))
    if saved_world != distributed.world_size():
        raise CheckpointError(
            f"checkpoint {str(checkpoint)!r} was written by {saved_world} process(es); resume it with as many, "
            f"not {distributed.world_size()}"
        )
    rng = training["rng"]
    return rng[distributed.rank()] if isinstance(rng, list) else rng


def _json_settings(settings: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in settings.items()}
