"""Training a head on data files: what ``pyro-multihop train`` does between parsing its options and printing.

Two steps, so that the command can print between them:

- :func:`start_training` checks the options and the output folder, joins the process group under ``torchrun``
  (each process then reads only its shard of the rows, :mod:`pyro_multihop.distributed`), reads the data, fixes
  the vocabulary sizes and, for SVI, builds the head (:func:`pyro_multihop.models.registry.build_head`) and
  checks that a checkpoint to ``resume`` holds that head. Every refusal comes before anything is written.
- :func:`finish_training` fits the head by SVI (:func:`~pyro_multihop.train.fit_svi`, ``--starts K`` starts)
  or EM (:mod:`pyro_multihop.em.em_runs`), evaluates it on every process's rows and, on rank 0 alone, writes
  ``metrics.csv``, ``loss.png`` (and ``accuracy.png`` with held-out data) and ``summary.json`` (an SVI run's
  with its ``diagnostics`` and, with several starts, ``starts``: :mod:`pyro_multihop.experiments.fit_findings`);
  it returns the lines the command prints, a ``warning: <message> (try: <hint>)`` line for each diagnostic.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import torch

from .. import distributed
from ..checkpoint import read_checkpoint
from ..diagnostics import DiagnosticWarning
from ..em.em_runs import run_chained_em, run_variational_em
from ..models.registry import build_head
from ..plots import plot_training_curves
from ..runs import BEST_CHECKPOINT_NAME, CHECKPOINT_NAME, RunDirError, prepare_run_dir
from ..train import OverfittingWarning, fit_svi, split_validation
from . import command_defaults
from .command_files import CommandError, load_data, save_figure, torch_device, write_json
from .fit_findings import diagnostic_line, fit_findings, pass_on_unrecorded, starts_line

__all__ = ["TrainFilesSettings", "TrainingRun", "TrainReport", "gate_variance", "start_training", "finish_training",
           "training_title"]


@dataclass(frozen=True)
class TrainFilesSettings:
    """The ``train`` command's options, one field per option under its name (``pyro-multihop train --help``
    says what each means; None: the default the option names)."""

    data: Path
    val: Optional[Path]
    valid_fraction: Optional[float]
    patience: Optional[int]
    model: str
    method: str
    hops: int
    sigma2: Optional[float]
    embed_dim: int
    symbols: Optional[int]
    targets: Optional[int]
    steps: Optional[int]
    lr: Optional[float]
    batch_size: Optional[int]
    tol: float
    seed: int
    starts: int
    processes: Optional[int]
    device: str
    dtype: str
    log_every: Optional[int]
    checkpoint_every: Optional[int]
    resume: bool
    overwrite: bool
    jit: bool
    collapsed: bool
    no_progress: bool
    out: Path


@dataclass
class TrainingRun:
    """A run checked and read, before fitting: this process's rows, the vocabulary sizes, the SVI head
    (None for EM, whose runs build their own) and the step of the checkpoint it resumes (None: from scratch)."""

    settings: TrainFilesSettings
    device: torch.device
    train_obs: object
    val_obs: Optional[object]
    num_symbols: int
    num_targets: int
    model: Optional[torch.nn.Module]
    resume_step: Optional[int]

    @property
    def checkpoint(self) -> Path:
        return self.settings.out / CHECKPOINT_NAME

    @property
    def is_main(self) -> bool:
        """Whether this process prints and writes the outputs (rank 0, or the only process)."""
        return distributed.rank() == 0


@dataclass(frozen=True)
class TrainReport:
    """What a finished run gives the command: ``summary`` (as written to ``summary.json``) and the ``lines``
    it prints (notes, the log-likelihoods and accuracies, the best checkpoint, the files written)."""

    summary: dict
    lines: List[str]


def gate_variance(settings: TrainFilesSettings) -> float:
    """``--sigma2``, else the command's default for ``--model``
    (:data:`~pyro_multihop.experiments.command_defaults.TRAIN_SIGMA2`, what ``train --help`` shows)."""
    return command_defaults.TRAIN_SIGMA2[settings.model] if settings.sigma2 is None else settings.sigma2


def check_options(settings: TrainFilesSettings, device: torch.device) -> None:
    """Options that contradict each other or do not apply to the method, before any process reads data."""
    if settings.val is not None and settings.valid_fraction is not None:
        raise CommandError("give --val or --valid-fraction, not both")
    if settings.patience is not None and settings.val is None and settings.valid_fraction is None:
        raise CommandError("--patience needs held-out data: --val FILE or --valid-fraction F")
    if settings.method != "em":
        return
    if settings.starts > 1:
        raise CommandError(f"--starts {settings.starts}: several starts are an SVI option (--method svi); EM fits "
                           "one start")
    svi_only = (settings.batch_size is not None or settings.resume or settings.jit or settings.collapsed
                or settings.patience is not None)
    if settings.model == "chained" and (svi_only or settings.lr is not None):
        raise CommandError("--batch-size, --lr, --resume, --jit, --collapsed and --patience apply to --method svi only")
    if settings.model == "tied" and svi_only:
        raise CommandError("--batch-size, --resume, --jit, --collapsed and --patience apply to --method svi only")
    if settings.model == "tied" and (device.type != "cpu" or getattr(torch, settings.dtype) != torch.get_default_dtype()):
        raise CommandError("--model tied --method em runs on the CPU in the default dtype only")


def start_training(settings: TrainFilesSettings) -> TrainingRun:
    """Check, join the process group (under ``torchrun``), read and size the data, build the SVI head and check
    the checkpoint it resumes: the first step of the module docstring."""
    device = torch_device(settings.device)
    check_options(settings, device)
    try:  # before anything is read or printed
        prepare_run_dir(settings.out, resume=settings.resume, overwrite=settings.overwrite, create=False)
    except RunDirError as error:
        raise CommandError(str(error)) from None
    # Under torchrun: join the process group (nccl with one GPU per process, gloo on CPUs).
    if distributed.init_from_env(backend="nccl" if device.type == "cuda" else "gloo"):
        device = torch_device(str(distributed.local_device(device)))
    shard = (distributed.rank(), distributed.world_size()) if distributed.is_distributed() else None
    with distributed.agreed():  # a bad row in one process's shard ends every process
        train_obs = load_data(settings.data, shard)
        val_obs = load_data(settings.val, shard) if settings.val is not None else None
        if settings.valid_fraction is not None:
            train_obs, val_obs = split_validation(train_obs, settings.valid_fraction, seed=settings.seed)
    both = [train_obs] + ([val_obs] if val_obs is not None else [])
    num_symbols = settings.symbols or distributed.all_reduce_max(max(o.num_symbols for o in both))
    num_targets = settings.targets or max(num_symbols, distributed.all_reduce_max(max(o.num_targets for o in both)))
    with distributed.agreed():
        for path, obs in ((settings.data, train_obs), (settings.val, val_obs)):
            if obs is not None:
                try:
                    obs.check_sizes(num_symbols, num_targets)
                except ValueError as error:
                    raise CommandError(f"data file {str(path)!r} does not fit --symbols/--targets: {error}") from None
        if distributed.rank() == 0:
            settings.out.mkdir(parents=True, exist_ok=True)
            if settings.overwrite and (settings.out / BEST_CHECKPOINT_NAME).exists():
                (settings.out / BEST_CHECKPOINT_NAME).unlink()  # not this run's best
    run = TrainingRun(settings, device, train_obs, val_obs, num_symbols, num_targets, None, None)
    if settings.method == "svi":
        run.model = build_head(settings.model, n_hops=settings.hops, num_symbols=num_symbols, num_targets=num_targets,
                               embed_dim=settings.embed_dim, seed=settings.seed, sigma2=gate_variance(settings))
        run.model = run.model.to(device=device, dtype=getattr(torch, settings.dtype))
        run.resume_step = _resume_step(settings, run.model, run.checkpoint)
    return run


def _resume_step(settings: TrainFilesSettings, model, checkpoint_path: Path) -> Optional[int]:
    """The step of the checkpoint to resume, after checking that it holds this command's model; None
    without ``resume`` or a checkpoint."""
    if not (settings.resume and checkpoint_path.is_file()):
        return None
    state = read_checkpoint(checkpoint_path)
    config = dict(model.config())
    if state["model_class"] != type(model).__name__ or dict(state["config"]) != config:
        saved = dict(state["config"])
        differ = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
        what = ", ".join(f"{k} = {saved.get(k)!r} there, {config.get(k)!r} here" for k in differ)
        raise CommandError(f"--resume: {checkpoint_path} holds a {state['model_class']} of another configuration "
                           f"({what or 'another class'}); give the options it was trained with, or --overwrite")
    return int(state["step"])


def finish_training(run: TrainingRun) -> Optional[TrainReport]:
    """Fit, evaluate and write the outputs: the second step of the module docstring. Returns the report on
    rank 0 (or without a process group), None on the other ranks, which print nothing."""
    settings = run.settings
    started = time.perf_counter()
    best, findings = None, {}
    if settings.method == "svi":
        metrics, run_settings, notes, best = _fit_svi(run)
        model, findings = run.model, fit_findings(metrics)
    else:
        model, metrics, run_settings, notes = _fit_em(run)
    seconds = time.perf_counter() - started
    train_result = distributed.evaluate(model, run.train_obs.to(run.device))
    val_result = None if run.val_obs is None else distributed.evaluate(model, run.val_obs.to(run.device))
    if not run.is_main:
        return None
    figures = _write_metrics(run, metrics)
    out = settings.out
    summary = {
        "model": type(model).__name__,
        "method": settings.method,
        "config": model.config(),
        "settings": run_settings,
        "seconds": seconds,
        "processes": distributed.world_size(),
        "train": train_result,
        "val": val_result,
        "checkpoint": str(run.checkpoint),
        "best": best,
        "metrics": str(out / "metrics.csv"),
        "figures": [str(f) for f in figures],
        **findings,
    }
    write_json(out / "summary.json", summary)
    lines = list(notes)
    lines.append(f"{settings.model}/{settings.method}: {seconds:.1f} s; train log-likelihood "
                 f"{train_result['log_likelihood']:.4f}, accuracy {train_result['accuracy']:.4f}")
    if val_result is not None:
        lines.append(f"held-out log-likelihood {val_result['log_likelihood']:.4f}, accuracy "
                     f"{val_result['accuracy']:.4f} (last parameters)")
    if best is not None:
        lines.append(f"best checkpoint: {out / BEST_CHECKPOINT_NAME} (step {best['step']}: highest held-out "
                     f"log-likelihood, {best['log_likelihood']:.4f}{'; stopped early' if best['stopped_early'] else ''})")
    written = [run.checkpoint] + ([out / BEST_CHECKPOINT_NAME] if best is not None else [])
    written += [out / "metrics.csv", *figures, out / "summary.json"]
    lines.append(f"wrote {', '.join(str(p) for p in written)}")
    return TrainReport(summary, lines)


def _fit_svi(run: TrainingRun) -> tuple:
    """``(metrics, settings, notes, best)`` of an SVI run; the OverfittingWarning, the starts and the fit's
    diagnostics become notes."""
    settings = run.settings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DiagnosticWarning)  # OverfittingWarning is one
        metrics = fit_svi(
            run.model, run.train_obs, num_steps=settings.steps, lr=settings.lr, batch_size=settings.batch_size,
            val=run.val_obs, patience=settings.patience, seed=settings.seed, progress=not settings.no_progress,
            jit=settings.jit, collapsed=settings.collapsed, log_every=settings.log_every, checkpoint=run.checkpoint,
            checkpoint_every=settings.checkpoint_every, resume=settings.resume, starts=settings.starts,
            processes=settings.processes,
        )
    records = fit_findings(metrics)
    notes = [f"warning: {w.message}" for w in caught if issubclass(w.category, OverfittingWarning)]
    notes += [line for line in [starts_line(records.get("starts"))] if line is not None]
    notes += [diagnostic_line(record) for record in records["diagnostics"]]
    pass_on_unrecorded(caught, records["diagnostics"], skip=(OverfittingWarning,))
    if metrics.attrs["divergences"]:
        notes.append(f"note: {len(metrics.attrs['divergences'])} divergence(s) caught; best parameters restored each time")
    return metrics, metrics.attrs["settings"], notes, metrics.attrs.get("best_val")


def _fit_em(run: TrainingRun) -> tuple:
    """``(model, metrics, settings, notes)`` of closed-form EM (chained) or variational EM (tied)."""
    settings = run.settings
    options = dict(n_hops=settings.hops, num_symbols=run.num_symbols, num_targets=run.num_targets, seed=settings.seed,
                   sigma2=gate_variance(settings), checkpoint=run.checkpoint)
    if settings.steps is not None or settings.model == "chained":
        options["max_iters"] = settings.steps or command_defaults.TRAIN_EM_ITERATIONS
    if settings.model == "chained":
        return run_chained_em(run.train_obs, run.val_obs, tol=settings.tol, dtype=getattr(torch, settings.dtype),
                              device=run.device, **options)
    return run_variational_em(run.train_obs, run.val_obs, embed_dim=settings.embed_dim, lr=settings.lr, **options)


def _write_metrics(run: TrainingRun, metrics) -> list:
    """metrics.csv, loss.png and (with held-out data) accuracy.png; returns the figures' paths."""
    out = run.settings.out
    metrics.to_csv(out / "metrics.csv", index=False)
    title, x_label = training_title(run.settings, len(run.train_obs), run.val_obs)
    figures = [save_figure(plot_training_curves(metrics, which="loss", title=title, x_label=x_label), out / "loss.png")]
    if "val_accuracy" in metrics.columns:
        figures.append(save_figure(plot_training_curves(metrics, which="accuracy", title=title, x_label=x_label),
                                   out / "accuracy.png"))
    return figures


def training_title(settings, n_train: int, val_obs) -> tuple:
    """Title (head, method, data) and x-axis label of the training figures, from the run's ``settings``
    (``model``, ``method``, ``data``, ``val``), its number of training rows and its held-out rows (or None)."""
    method = {"svi": "SVI", "em": "EM" if settings.model == "chained" else "variational EM"}[settings.method]
    title = f"{settings.model} head, {method} on {settings.data.name} ({n_train} rows)"
    if settings.val is not None:
        title += f"; held-out {settings.val.name} ({len(val_obs)} rows)"
    elif val_obs is not None:
        title += f"; held-out {len(val_obs)} rows of it"
    return title, "step" if settings.method == "svi" else f"{method} iteration"
