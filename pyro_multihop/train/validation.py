"""Held-out data during an SVI run: the split, the best held-out log-likelihood, early stopping, and the
warning when the fit overfits.

:func:`split_validation` holds out a share of the training rows (``val_fraction``); :class:`ValidationRecord`
keeps the best held-out log-likelihood of a run and the evaluations since (``patience``);
:func:`warn_if_overfitting` issues :class:`OverfittingWarning` at the end of a run.
"""

from __future__ import annotations

import math
import warnings
from typing import Optional

import pandas as pd
import torch

from ..diagnostics import HeldOutDeclineWarning

__all__ = ["OVERFITTING_TOLERANCE", "OverfittingWarning", "ValidationRecord", "split_validation",
           "warn_if_overfitting"]


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


class OverfittingWarning(HeldOutDeclineWarning):
    """The held-out log-likelihood of the last parameters is clearly below its best during the run (a
    :class:`~pyro_multihop.diagnostics.HeldOutDeclineWarning` that names the best checkpoint)."""


#: Nats per held-out observation below the best that :class:`OverfittingWarning` reports.
OVERFITTING_TOLERANCE = 0.01


class ValidationRecord:
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
        """True once ``patience`` evaluations have passed without a new best."""
        return self.patience is not None and self.since_best >= self.patience

    def state(self) -> dict:
        """What a checkpoint carries of the record."""
        return {"best_log_likelihood": self.best_log_likelihood, "best_step": self.best_step,
                "since_best": self.since_best, "stopped_early": self.stopped_early}

    def load(self, state: dict) -> None:
        """Restore what :meth:`state` returned."""
        self.best_log_likelihood = state["best_log_likelihood"]
        self.best_step = state["best_step"]
        self.since_best = state["since_best"]
        self.stopped_early = state["stopped_early"]


def warn_if_overfitting(metrics: pd.DataFrame, stacklevel: int) -> None:
    """:class:`OverfittingWarning` when the last held-out log-likelihood of ``metrics`` (a frame of
    :func:`~pyro_multihop.fit_svi`) is more than :data:`OVERFITTING_TOLERANCE` below the best one of the run;
    ``stacklevel`` is :func:`warnings.warn`'s, counted from this function (as in
    :func:`~pyro_multihop.diagnostics.diagnose_fit`)."""
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
            stacklevel=stacklevel,
        )
