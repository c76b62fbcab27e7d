"""Fit a head by SVI: :func:`fit_svi`, which checks its arguments, prepares the data, the loss and the random
stream, and hands the steps to :class:`~pyro_multihop.train.svi_run.SviRun`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Optional, Union

import pandas as pd
import pyro
import torch

from .. import distributed
from ..runs import BEST_CHECKPOINT_NAME
from .random_state import rng_devices
from .settings import svi_settings
from .svi_loss import SviLoss
from .svi_run import SviRun
from .validation import split_validation

__all__ = ["fit_svi"]


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
    divergence_warmup: Optional[int] = None,
    starts: int = 1,
    processes: Optional[int] = None,
    init_scale: Optional[float] = None,
) -> pd.DataFrame:
    """Fit ``model``'s parameters to ``obs`` by SVI on ``TraceEnum_ELBO`` (see :mod:`pyro_multihop.train`).

    The arguments, by what they control (listed below in the same order):

    - the head and its data: ``model``, ``obs``;
    - the settings, each left None taken from ``model.svi_defaults()`` and then from
      :data:`~pyro_multihop.train.settings.SVI_DEFAULTS` (:func:`~pyro_multihop.train.settings.svi_settings`):
      ``num_steps``, ``lr``, ``lr_decay``, ``batch_size``, ``clip_norm``, ``weight_decay``, ``log_every``,
      ``divergence_threshold``, ``divergence_warmup``, ``init_scale``;
    - the loss: ``collapsed``, ``group_lengths``, ``jit``;
    - held-out data and early stopping: ``val``, ``val_fraction``, ``patience``;
    - checkpoints: ``checkpoint``, ``checkpoint_every``, ``best_checkpoint``, ``resume``;
    - the run itself: ``seed``, ``progress``, ``callback``;
    - several starts: ``starts``, ``processes``, ``init_scale``.

    :param model: a head of this library (``model``, ``guide``, ``svi_kwargs``, ``evaluate``,
        ``check_observations``); fitted in place.
    :param obs: training data of any type the head accepts (``model.check_observations``): it needs ``len``,
        ``.to(device)`` and row indexing (moved to the model's device).
    :param int num_steps: optimisation steps.
    :param float lr: initial learning rate of ClippedAdam.
    :param float lr_decay: learning rate after ``num_steps`` steps / initial one (geometric decay).
    :param int batch_size: mini-batch size (``pyro.plate`` subsampling, likelihood scaled to the full data);
        where the settings leave it None, the full data every step (exact gradient).
    :param float clip_norm: ClippedAdam's element-wise clip of the per-observation gradient.
    :param weight_decay: L2 penalty on the per-observation loss, a float or ``{parameter name: float}``
        (names as in ``model.named_parameters()``; see :mod:`pyro_multihop.train`).
    :param int log_every: steps between rows of the returned metrics.
    :param float divergence_threshold: nats per observation above the best full-data loss that count as a
        divergence (``math.inf`` disables the guard: :mod:`~pyro_multihop.train.divergence_guard`).
    :param int divergence_warmup: steps at the start during which a rise of the loss is no divergence (Adam's
        early rise at a large learning rate); the guard's reference restarts after them.
    :param bool collapsed: train ``model.collapsed_model`` (the hop path summed out by the engine:
        :class:`~pyro_multihop.distributions.CollapsedHopChain`) under ``Trace_ELBO`` instead of the enumerated
        ``model.model`` under ``TraceEnum_ELBO``: the same loss and gradient, faster (both are measured in
        ``benchmarks/results/length_groups.md``).
    :param int group_lengths: group rows by context length, rounded up to this many positions, and cut each
        group to its width before the loss: exact, and several times faster where most contexts are much
        shorter than the longest (bAbI: ``benchmarks/results/length_groups.md``). Needs data with
        ``context_lengths()`` and ``truncate_context()``.
    :param bool jit: use ``JitTraceEnum_ELBO`` (traced once per mini-batch size) for the training loss; the
        data type must be built from tensor attributes of its constructor's argument names
        (:class:`~pyro_multihop.train.jit_fields.JitFields`).
    :param val: optional held-out data, evaluated (``model.evaluate``) at every logged step.
    :param float val_fraction: instead of ``val``, hold out this share of ``obs`` (rows drawn by ``seed``,
        see :func:`~pyro_multihop.train.validation.split_validation`) and train on the rest.
    :param int patience: early stopping: stop once the held-out log-likelihood has not improved for this many
        evaluations (logged steps). Needs ``val`` or ``val_fraction``.
    :param checkpoint: optional path; the model, optimiser, random and guard state are saved there every
        ``checkpoint_every`` steps and at the end.
    :param int checkpoint_every: steps between checkpoints (default: ``num_steps // 10``).
    :param best_checkpoint: where the parameters of the best held-out log-likelihood are saved whenever it
        improves (default, with ``checkpoint`` and held-out data: ``best.pt`` beside ``checkpoint``).
    :param bool resume: if ``checkpoint`` exists, continue from it: parameters, optimiser state, learning
        rate, random state and guard state are restored, so the result equals that of an uninterrupted run
        (bit for bit without ``jit``; tracing draws from the random stream when it compiles). A finished
        checkpoint is loaded into ``model`` and its metrics are returned without training.
    :param seed: seed of the run's random stream (mini-batches, Monte Carlo guides). The caller's global
        torch random state is left as it was. None draws from the global stream instead.
    :param bool progress: show progress on stderr (a bar on a terminal, periodic lines otherwise:
        :func:`pyro_multihop.runs.progress_bar`).
    :param callback: ``callback(step, model, row)`` after every logged row; returning True stops the fit.
    :param int starts: fit this many starts and keep the one with the best held-out log-likelihood
        (:func:`~pyro_multihop.train.multistart.fit_svi_starts`: start 0 is this fit, the others perturbed by
        ``init_scale``; the held-out rows are ``val``, or ``val_fraction`` of ``obs``, by default 0.1). 1 (the
        default): one plain fit.
    :param int processes: with ``starts`` > 1, processes that fit starts at once (default: one per start up to
        the usable cores; 1 on a GPU or with a ``callback``).
    :param float init_scale: with ``starts`` > 1, the standard deviation of the noise added to every parameter
        of starts 1..K-1.
    :raises TrainingInterrupted: with a ``checkpoint``, SIGINT (Ctrl-C) or SIGTERM during the loop lets the
        current step finish, writes the checkpoint at that step and raises this ``KeyboardInterrupt``
        (resuming from it gives the uninterrupted result). A second signal interrupts at once.
    :returns: a DataFrame with one row per logged step: ``step`` (steps taken), ``loss`` (full-data loss
        per observation), ``lr``, ``seconds`` and, with held-out data, ``val_log_likelihood`` and
        ``val_accuracy``. ``attrs`` holds ``settings``, ``best_step``, ``best_loss``, ``final_loss`` (loss
        of the last parameters), ``restored_best``, ``divergences``, ``resumed_from`` and, with held-out
        data, ``best_val`` (``step``, ``log_likelihood``, ``checkpoint``, ``stopped_early``); after a run that
        trained, ``diagnostics``: records ``{"kind", "message", "hint"}`` of the findings of
        :func:`~pyro_multihop.diagnostics.diagnose_fit` on the head and of
        :func:`~pyro_multihop.train.stuck.training_stuck`; with ``starts`` > 1, ``starts``: one record per start
        (:func:`~pyro_multihop.train.multistart.fit_svi_starts`).
    :raises ValueError: on empty data or an invalid setting.
    :warns OverfittingWarning: when the last held-out log-likelihood is clearly below its best.
    :warns PosteriorCollapseWarning: when the head's posterior stays at its prior (the tied head).
    :warns TrainingStuckWarning: when the divergence guard fired more than once, or the run ended near its
        step-0 loss (:mod:`~pyro_multihop.train.stuck`).

    Example::

        >>> from pyro_multihop import ChainedAttention, transitive_task
        >>> from pyro_multihop.train import fit_svi
        >>> head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
        >>> metrics = fit_svi(head, transitive_task(200, seed=0), num_steps=20, progress=False)
        >>> list(metrics.columns)
        ['step', 'loss', 'lr', 'seconds']
    """
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
        raise ValueError(f"starts must be a positive integer, got {starts!r}")
    if starts > 1:
        from .multistart import fit_svi_starts  # it fits each start with this function

        return fit_svi_starts(
            model, obs, starts=starts, processes=processes, init_scale=init_scale, seed=seed, val=val,
            val_fraction=val_fraction, checkpoint=checkpoint, best_checkpoint=best_checkpoint, progress=progress,
            stacklevel=3, num_steps=num_steps, lr=lr, batch_size=batch_size, patience=patience, jit=jit,
            callback=callback, lr_decay=lr_decay, clip_norm=clip_norm, weight_decay=weight_decay,
            log_every=log_every, divergence_threshold=divergence_threshold, divergence_warmup=divergence_warmup,
            checkpoint_every=checkpoint_every, resume=resume, collapsed=collapsed, group_lengths=group_lengths,
        )
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
        divergence_warmup=divergence_warmup,
        init_scale=init_scale,
    )
    device = next(model.parameters()).device
    obs = obs.to(device)
    val = None if val is None else val.to(device)
    if best_checkpoint is None and checkpoint is not None and val is not None:
        best_checkpoint = Path(checkpoint).with_name(BEST_CHECKPOINT_NAME)

    shards = (int(total), distributed.all_reduce_max(len(obs)))
    loss = SviLoss(model, obs, settings["batch_size"], jit, *shards, collapsed=collapsed, group_lengths=group_lengths)

    with torch.random.fork_rng(devices=rng_devices(device), enabled=seed is not None):
        if seed is not None:
            # Full batches: one stream on every rank (global latents drawn alike, the single-process step);
            # mini-batches: each rank its own stream.
            torch.manual_seed(int(seed) if loss.full_batch else distributed.rank_seed(int(seed)))
        with pyro.get_param_store().scope():
            run = SviRun(model, loss, settings, device, val=val, patience=patience, progress=progress,
                         callback=callback, checkpoint=checkpoint, checkpoint_every=checkpoint_every,
                         best_checkpoint=best_checkpoint)
            finished = run.resume() if checkpoint is not None and resume else None
            return finished if finished is not None else run.run()


def _check_optional_positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
