"""Several starts of one SVI fit, one answer: :func:`fit_svi_starts` (``fit_svi(..., starts=K)``).

A head that starts every parameter at the same value and trains on full batches (the structured-facts head)
gives the same fit for every seed, so a run that lands in a poor optimum cannot be retried by reseeding. The
field's practice is to train several starts and keep the best by a held-out criterion (MemN2N reports the
best of 10 runs by validation error). Here:

- start 0 is the plain fit (the head's own initial parameters, the caller's ``seed``), so ``starts=1`` is
  exactly :func:`~pyro_multihop.fit_svi`; start ``k >= 1`` adds ``N(0, init_scale^2)`` to every parameter
  of ``model.named_parameters()`` (Pyro's unconstrained ones for constrained parameters), drawn by a
  generator seeded with :func:`start_seed` ``(seed, k)``, which also seeds its run;
- a head may offer starts of its own in place of perturbed ones: where ``model.start_variant(k)`` sets the
  parameters for start ``k`` and returns what it did (a short text), that start is not perturbed (the
  structured-facts head's starts 1-3 are its emission without the comparison component and its equality
  weights at 0, so that the held-out likelihood chooses the emission and where training starts); it returns None
  where it has no start ``k``;
- every start trains on the same rows and is scored on the same held-out rows: the caller's ``val``, or a
  share of ``obs`` held out by :func:`~pyro_multihop.train.validation.split_validation` (``val_fraction``,
  default :data:`STARTS_VAL_FRACTION`), never a test set;
- the start with the highest held-out log-likelihood of its final parameters is kept (the lowest index on
  a tie); its parameters end in ``model`` and its metrics are returned, with a record of every start in
  ``metrics.attrs["starts"]``;
- starts run in parallel processes (``torch.multiprocessing``, spawn, one thread each) where cores allow,
  one after another with ``processes=1``; under a ``torch.distributed`` process group each rank gathers the
  rows of every rank, fits its share of the starts (start ``k`` on rank ``k mod world_size``) on its own,
  and the kept start's parameters and metrics are broadcast from the rank that fitted it.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import copy
import hashlib
import logging
import math
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pandas as pd
import torch
import torch.multiprocessing

from .. import distributed
from ..diagnostics import diagnose_starts, diagnostic_records
from ..runs import BEST_CHECKPOINT_NAME, progress_bar
from .fit import fit_svi
from .jit_fields import JitFields
from .settings import svi_settings
from .validation import split_validation

__all__ = ["STARTS_VAL_FRACTION", "StartResult", "fit_one_start", "fit_svi_starts", "gather_rows",
           "perturb_parameters", "start_path", "start_seed"]

logger = logging.getLogger(__name__)

#: Share of the training rows held out to choose among the starts when the caller gives no held-out data.
STARTS_VAL_FRACTION = 0.1


def start_seed(seed: int, start: int) -> int:
    """The seed of start ``start`` of a fit seeded ``seed``: ``seed`` itself for start 0 (one start is the
    plain fit), a 63-bit hash of ``(seed, start)`` for the others."""
    if start == 0:
        return int(seed)
    digest = hashlib.sha256(f"pyro-multihop-start:{int(seed)}:{int(start)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@torch.no_grad()
def perturb_parameters(model, scale: float, seed: int) -> None:
    """Add ``N(0, scale^2)`` noise to every parameter of ``model.named_parameters()``, in place. The noise
    is drawn in float64 on the CPU by a generator seeded with ``seed``, parameter after parameter in the
    order of ``named_parameters()``, so that it is the same on every device and dtype."""
    generator = torch.Generator().manual_seed(int(seed))
    for _, parameter in model.named_parameters():
        noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64)
        parameter.add_(scale * noise.to(device=parameter.device, dtype=parameter.dtype))


def start_path(path, start: int) -> Optional[Path]:
    """Where start ``start`` keeps the file ``path`` names (``run.pt`` -> ``run.start2.pt``); None for None."""
    if path is None:
        return None
    path = Path(path)
    return path.with_name(f"{path.stem}.start{start}{path.suffix}")


@dataclass
class StartResult:
    """What one start returns: its record (``start``, ``seed``, ``start_from`` (in words), ``train_log_likelihood``,
    ``val_log_likelihood``, ``val_accuracy``, ``divergences``, ``diagnostics`` (kinds), ``kept``), its final
    parameters (a CPU ``state_dict``), its metrics frame and the warnings its fit issued."""

    record: dict
    state: dict = field(repr=False)
    metrics: pd.DataFrame = field(repr=False)
    warnings: list = field(default_factory=list, repr=False)


def _finite_or_none(value) -> Optional[float]:
    value = float(value)
    return value if math.isfinite(value) else None


def fit_one_start(model, initial_state: dict, train, val, start: int, seed: int, init_scale: float,
                  fit_kwargs: dict) -> StartResult:
    """Fit start ``start`` of :func:`fit_svi_starts` in this process: ``model`` set to ``initial_state``,
    perturbed (start >= 1), fitted by :func:`~pyro_multihop.fit_svi` on ``train`` with ``val``, and scored.
    Its warnings are caught and returned, so that only the kept start's reach the caller."""
    model.load_state_dict(initial_state)
    own_seed = start_seed(seed, start)
    start_variant = getattr(model, "start_variant", None)
    with torch.no_grad():
        variant = None if start_variant is None else start_variant(start)  # what it set, in words, or None
    if start > 0 and variant is None:
        perturb_parameters(model, init_scale, own_seed)
    kwargs = dict(fit_kwargs)
    kwargs["checkpoint"] = start_path(kwargs.get("checkpoint"), start)
    kwargs["best_checkpoint"] = start_path(kwargs.get("best_checkpoint"), start)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = fit_svi(model, train, val=val, seed=own_seed, **kwargs)
        held_out = model.evaluate(val)
        fitted = model.evaluate(train)
    record = {
        "start": start,
        "seed": own_seed,
        "start_from": variant or ("the head's own start" if start == 0 else f"perturbed (init_scale {init_scale:g})"),
        "train_log_likelihood": _finite_or_none(fitted["log_likelihood"]),
        "val_log_likelihood": _finite_or_none(held_out["log_likelihood"]),
        "val_accuracy": _finite_or_none(held_out["accuracy"]),
        "divergences": len(metrics.attrs.get("divergences", [])),
        "diagnostics": [d["kind"] for d in metrics.attrs.get("diagnostics", [])],
        "kept": False,
    }
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return StartResult(record, state, metrics, [w.message for w in caught])


# -- one worker process of a parallel fit ---------------------------------------------------------------------
_worker_job = {}


def _start_worker(model, initial_state, train, val, seed, init_scale, fit_kwargs) -> None:
    torch.set_num_threads(1)  # one start per core
    # torch.multiprocessing hands every worker the same shared-memory tensors: each fits its own copy (the data
    # is only read).
    _worker_job.update(model=copy.deepcopy(model), initial_state={k: v.clone() for k, v in initial_state.items()},
                       train=train, val=val, seed=seed, init_scale=init_scale, fit_kwargs=fit_kwargs)


def _worker_start(start: int) -> StartResult:
    job = _worker_job
    return fit_one_start(job["model"], job["initial_state"], job["train"], job["val"], start, job["seed"],
                         job["init_scale"], job["fit_kwargs"])


# -- the fit ----------------------------------------------------------------------------------------------
def fit_svi_starts(
    model,
    obs,
    *,
    starts: int,
    processes: Optional[int] = None,
    init_scale: Optional[float] = None,
    seed: Optional[int] = 0,
    val=None,
    val_fraction: Optional[float] = None,
    checkpoint=None,
    best_checkpoint=None,
    progress: bool = True,
    stacklevel: int = 2,
    **fit_kwargs,
) -> pd.DataFrame:
    """Fit ``starts`` starts of ``model`` to ``obs`` by :func:`~pyro_multihop.fit_svi` and keep the one with
    the best held-out log-likelihood (see :mod:`pyro_multihop.train.multistart`); ``fit_svi(...,
    starts=K)`` calls it.

    :param int starts: number of starts (1: one plain fit, still scored and recorded).
    :param int processes: processes that fit starts at once (spawned, one thread each). Default: one per
        start up to the CPU cores this process may use; 1 (in this process, one start after another) where
        the model is on a GPU or a ``callback`` is given (a callback must be picklable to run in another
        process). Under a process group each rank fits its starts one after another.
    :param float init_scale: standard deviation of the perturbation of starts 1..K-1 (default: the setting
        ``init_scale`` of :func:`~pyro_multihop.train.settings.svi_settings`).
    :param seed: seed of start 0; start ``k`` uses :func:`start_seed` ``(seed, k)``. None draws one from the
        global torch stream.
    :param val: held-out rows that choose the start; default: ``val_fraction`` of ``obs``.
    :param float val_fraction: share of ``obs`` held out (drawn by ``seed``) when ``val`` is None; default
        :data:`STARTS_VAL_FRACTION`.
    :param checkpoint: optional path; start ``k`` keeps its checkpoint in :func:`start_path` ``(checkpoint,
        k)`` (and resumes from it), and the kept start's is copied to ``checkpoint``; likewise
        ``best_checkpoint`` (default ``best.pt`` beside ``checkpoint``).
    :param bool progress: a progress display: each start's steps when they run one after another, the
        finished starts when they run in parallel.
    :param int stacklevel: where the kept start's warnings point, as for :func:`warnings.warn` (2: the
        caller of this function).
    :param fit_kwargs: the other arguments of :func:`~pyro_multihop.fit_svi`, passed to every start.
    :returns: the kept start's metrics (as :func:`~pyro_multihop.fit_svi` returns them), with
        ``attrs["starts"]``: one record per start, in start order (``start``, ``seed``,
        ``train_log_likelihood``, ``val_log_likelihood``, ``val_accuracy`` of the final parameters,
        ``divergences`` (count), ``diagnostics`` (kinds), ``kept``), and ``attrs["diagnostics"]`` the kept
        start's, plus :class:`~pyro_multihop.diagnostics.StartsDisagreeWarning` where the starts' held-out
        accuracies differ by more than a point.
    """
    if isinstance(starts, bool) or not isinstance(starts, int) or starts < 1:
        raise ValueError(f"starts must be a positive integer, got {starts!r}")
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 1):
        raise ValueError(f"processes must be a positive integer or None, got {processes!r}")
    if val is not None and val_fraction is not None:
        raise ValueError("give val or val_fraction, not both")
    scale = svi_settings(model, init_scale=init_scale)["init_scale"]
    model.check_observations(obs, "obs")
    if val is not None:
        model.check_observations(val, "val")
    if seed is None:
        seed = distributed.broadcast_object(int(torch.randint(2**62, ())))
    if distributed.is_distributed():  # every rank fits whole starts: it needs every row
        obs = gather_rows(obs)
        val = None if val is None else gather_rows(val)
    if val is None:
        obs, val = split_validation(obs, STARTS_VAL_FRACTION if val_fraction is None else val_fraction, seed=seed)
    if best_checkpoint is None and checkpoint is not None:
        best_checkpoint = Path(checkpoint).with_name(BEST_CHECKPOINT_NAME)
    fit_kwargs.update(checkpoint=checkpoint, best_checkpoint=best_checkpoint, init_scale=init_scale)
    device = next(model.parameters()).device
    initial_state = copy.deepcopy(model.state_dict())

    if distributed.is_distributed():
        results = _fit_on_ranks(model, initial_state, obs, val, starts, seed, scale, fit_kwargs, progress)
    else:
        if processes is None:
            parallel_ok = device.type == "cpu" and fit_kwargs.get("callback") is None
            processes = min(starts, _usable_cores()) if parallel_ok else 1
        processes = min(processes, starts)
        results = None
        if processes > 1:
            try:
                results = _fit_in_processes(model, initial_state, obs, val, starts, seed, scale, fit_kwargs,
                                            processes, progress)
            except concurrent.futures.process.BrokenProcessPool as error:
                warnings.warn(
                    f"the processes of the starts ended before they could fit ({error}); the starts run one after "
                    "another instead. The processes are spawned and import the __main__ script: a script that "
                    "fits several starts must guard its top level with `if __name__ == \"__main__\":` (or pass "
                    "processes=1)", UserWarning, stacklevel=stacklevel)
        if results is None:
            results = [fit_one_start(model, initial_state, obs, val, k, seed, scale, dict(fit_kwargs, progress=progress))
                       for k in range(starts)]
    if distributed.is_distributed():
        records = sorted((record for part in distributed.all_gather_objects([r.record for r in results])
                          for record in part), key=lambda record: record["start"])
        kept = _kept(records)
        mine = next((r for r in results if r.record["start"] == kept), None)
        kept_result = distributed.broadcast_object(mine, src=kept % distributed.world_size())
    else:
        records = [result.record for result in results]
        kept = _kept(records)
        kept_result = results[kept]
    for record in records:
        record["kept"] = record["start"] == kept
    start_variant = getattr(model, "start_variant", None)
    if start_variant is not None:  # start 0, the head's own: undoes what a variant set beside the parameters
        with torch.no_grad():
            start_variant(0)
    model.load_state_dict({k: v.to(device) for k, v in kept_result.state.items()})
    if distributed.rank() == kept % distributed.world_size():
        _copy_kept_files(kept, checkpoint, best_checkpoint)
    metrics = kept_result.metrics
    if metrics.attrs.get("best_val") and metrics.attrs["best_val"].get("checkpoint") is not None:
        metrics.attrs["best_val"] = dict(metrics.attrs["best_val"], checkpoint=str(best_checkpoint))
    metrics.attrs["starts"] = records
    for message in kept_result.warnings:
        warnings.warn(message, stacklevel=stacklevel)
    disagree = diagnose_starts([record["val_accuracy"] for record in records], stacklevel=stacklevel + 1)
    metrics.attrs["diagnostics"] = list(metrics.attrs.get("diagnostics", [])) + diagnostic_records(disagree)
    logger.info("kept start %d of %d (held-out log-likelihood %s)", kept, starts, records[kept]["val_log_likelihood"])
    return metrics


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _kept(records) -> int:
    """The start with the highest held-out log-likelihood (None or NaN counts as -inf; the first on a tie)."""
    best, best_value = None, -math.inf
    for record in records:
        value = record["val_log_likelihood"]
        value = -math.inf if value is None or not math.isfinite(value) else value
        if best is None or value > best_value:
            best, best_value = record["start"], value
    return best


def _fit_in_processes(model, initial_state, train, val, starts, seed, scale, fit_kwargs, processes,
                      progress) -> List[StartResult]:
    context = torch.multiprocessing.get_context("spawn")
    fit_kwargs = dict(fit_kwargs, progress=False)
    arguments = (copy.deepcopy(model).cpu(), {k: v.cpu() for k, v in initial_state.items()}, train.to("cpu"),
                 val.to("cpu"), seed, scale, fit_kwargs)
    results = [None] * starts
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context, initializer=_start_worker,
                                                initargs=arguments) as pool, \
            progress_bar(starts, desc="starts", unit="start", enabled=progress) as bar:
        futures = {pool.submit(_worker_start, k): k for k in range(starts)}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
            bar.update(1)
    return results


def _fit_on_ranks(model, initial_state, train, val, starts, seed, scale, fit_kwargs, progress) -> List[StartResult]:
    """This rank's starts (``k mod world_size == rank``), each fitted on this rank alone."""
    mine = range(distributed.rank(), starts, distributed.world_size())
    with distributed.agreed(), distributed.single_process():
        return [fit_one_start(model, initial_state, train, val, k, seed, scale,
                              dict(fit_kwargs, progress=progress and distributed.rank() == 0)) for k in mine]


def _copy_kept_files(kept: int, checkpoint, best_checkpoint) -> None:
    for path in (checkpoint, best_checkpoint):
        source = start_path(path, kept)
        if source is not None and source.exists():
            shutil.copyfile(source, path)


def gather_rows(obs):
    """Every rank's rows of ``obs``, in rank order, on every rank (without a process group: ``obs``). The
    data type is rebuilt from its constructor's tensor arguments, concatenated along the rows (as
    :class:`~pyro_multihop.train.jit_fields.JitFields` reads them)."""
    if not distributed.is_distributed():
        return obs
    try:
        names = JitFields(obs).names
    except TypeError as error:
        raise TypeError(f"fit_svi(starts=K) under a process group gathers every rank's rows: {error}") from None
    parts = distributed.all_gather_objects(obs.to("cpu"))
    fields = {}
    for name in names:
        values = [getattr(part, name) for part in parts]
        fields[name] = None if all(v is None for v in values) else torch.cat(values)
    return type(obs)(**fields)
