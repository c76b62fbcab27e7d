"""Diagnostics after a fit: each finding is a warning of its own class, with a one-line cause and the option
to try.

:func:`diagnose_fit` checks what it is given:

- a fitted tied-embedding posterior (a head with ``embeddings()``, or ``(mean, scale)``): **posterior
  collapse** (:class:`PosteriorCollapseWarning`), when the posterior standard deviations are near the
  prior's 1 *and* the posterior means are close together, by the two measures of ``docs/tied.md``: the
  mean posterior sd, and the mean pairwise Euclidean distance between the means, against the prior's
  typical distance ``sqrt(2 D)`` between two independent draws;
- a metrics frame with ``step`` and a held-out log-likelihood column (per observation, higher is better):
  **held-out decline** (:class:`HeldOutDeclineWarning`), when the last held-out value is more than
  ``tolerance`` nats per observation below the best one, reached at an earlier step;
- a metrics frame with an ``objective`` column and a training ``log_likelihood`` column (both per
  observation, higher is better, e.g. variational EM's annealed ELBO and its plug-in log-likelihood):
  **objective mismatch** (:class:`ObjectiveMismatchWarning`), when at the end the log-likelihood is more
  than ``gap`` nats per observation below the objective, or the objective rose over the last ``window``
  rows while the log-likelihood fell by more than ``tolerance``. A run that stopped ("converged") on such
  an objective stopped on a quantity that does not say how well its predictor fits.

Example::

    >>> import warnings
    >>> import torch
    >>> from pyro_multihop.diagnostics import diagnose_fit
    >>> mean, scale = 0.05 * torch.randn(20, 8), torch.ones(20, 8)    # a posterior at the prior's centre
    >>> with warnings.catch_warnings(record=True):
    ...     warnings.simplefilter("always")
    ...     found = diagnose_fit(posterior=(mean, scale))
    >>> [type(d).__name__ for d in found]
    ['PosteriorCollapseWarning']
"""

from __future__ import annotations

import math
import warnings
from typing import List, Optional, Tuple

import pandas as pd
import torch

__all__ = [
    "DiagnosticWarning",
    "PosteriorCollapseWarning",
    "HeldOutDeclineWarning",
    "ObjectiveMismatchWarning",
    "posterior_spread",
    "diagnose_fit",
]


class DiagnosticWarning(UserWarning):
    """Base class of the warnings of :func:`diagnose_fit`."""


class PosteriorCollapseWarning(DiagnosticWarning):
    """The tied head's posterior sits at the prior: standard deviations near 1, means close together."""


class HeldOutDeclineWarning(DiagnosticWarning):
    """The held-out log-likelihood got worse after its best point."""


class ObjectiveMismatchWarning(DiagnosticWarning):
    """The quantity a fit optimised (and stopped on) disagrees with the log-likelihood."""


def posterior_spread(mean: torch.Tensor, scale: torch.Tensor) -> Tuple[float, float]:
    """``(mean posterior sd, mean pairwise distance of the means)`` of an ``(S, D)`` posterior: the two
    collapse measures of ``docs/tied.md`` (distances Euclidean, over the ``S (S - 1)`` ordered pairs)."""
    mean, scale = torch.as_tensor(mean).detach(), torch.as_tensor(scale).detach()
    if mean.dim() != 2 or scale.shape != mean.shape:
        raise ValueError(f"posterior mean and scale must both have shape (S, D), got {tuple(mean.shape)} "
                         f"and {tuple(scale.shape)}")
    distance = float(torch.pdist(mean.double()).mean()) if mean.shape[0] > 1 else math.inf
    return float(scale.double().mean()), distance


def diagnose_fit(
    model=None,
    metrics: Optional[pd.DataFrame] = None,
    *,
    posterior: Optional[Tuple[torch.Tensor, torch.Tensor]] = None,
    held_out: str = "val_log_likelihood",
    objective: Optional[str] = None,
    log_likelihood: str = "log_likelihood",
    converged: Optional[bool] = None,
    collapse_scale: float = 0.8,
    collapse_distance: float = 0.5,
    tolerance: float = 0.01,
    gap: float = 0.1,
    window: int = 10,
    warn: bool = True, stacklevel: int = 2,
) -> List[DiagnosticWarning]:
    """Check a finished fit; returns the diagnostics found (each a :class:`DiagnosticWarning` instance) and,
    with ``warn``, issues each with ``warnings.warn``.

    :param model: a fitted head; its posterior is checked if it has ``embeddings() -> (mean, scale)`` (the
        tied head). Other heads are accepted and give no posterior check.
    :param metrics: a DataFrame with a ``step`` column, one row per logged step or iteration.
    :param posterior: ``(mean, scale)``, ``(S, D)`` each, instead of ``model``.
    :param str held_out: the held-out log-likelihood column of ``metrics`` (skipped if absent or all NaN).
    :param objective: the column of the optimised objective per observation (None: no mismatch check).
    :param str log_likelihood: the training log-likelihood column compared with ``objective``.
    :param converged: whether the fit met its stopping rule (only worded into the message).
    :param float collapse_scale: collapse needs a mean posterior sd above this (the prior's is 1).
    :param float collapse_distance: and a mean pairwise distance of the means below this fraction of
        ``sqrt(2 D)``, the typical distance between two draws of the prior.
    :param float tolerance: nats per observation of a held-out decline, and of a training log-likelihood
        fall while the objective rose.
    :param float gap: nats per observation by which the objective may exceed the log-likelihood at the end.
    :param int window: rows of ``metrics`` over which the objective's and the log-likelihood's trends are read.
    """
    if metrics is not None and not isinstance(metrics, pd.DataFrame):
        raise TypeError(f"metrics must be a pandas DataFrame, got {type(metrics).__name__}")
    if metrics is not None and "step" not in metrics.columns:
        raise ValueError(f"metrics must have a 'step' column, got columns {list(metrics.columns)}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive integer, got {window!r}")
    if posterior is None and model is not None and callable(getattr(model, "embeddings", None)):
        posterior = model.embeddings()
    found = []
    if posterior is not None:
        found += _posterior_collapse(*posterior, collapse_scale, collapse_distance)
    if metrics is not None and held_out in metrics.columns:
        found += _held_out_decline(metrics, held_out, tolerance)
    if metrics is not None and objective is not None:
        for column in (objective, log_likelihood):
            if column not in metrics.columns:
                raise ValueError(f"metrics has no column {column!r}; columns are {list(metrics.columns)}")
        found += _objective_mismatch(metrics, objective, log_likelihood, converged, tolerance, gap, window)
    if warn:
        for diagnostic in found:
            warnings.warn(diagnostic, stacklevel=stacklevel)
    return found


def _posterior_collapse(mean, scale, collapse_scale: float, collapse_distance: float) -> list:
    spread, distance = posterior_spread(mean, scale)
    typical = math.sqrt(2.0 * mean.shape[-1])
    if spread > collapse_scale and distance < collapse_distance * typical:
        return [PosteriorCollapseWarning(
            f"posterior collapse: mean posterior sd {spread:.2f} (prior 1), mean pairwise distance of the "
            f"embedding means {distance:.2f} (prior draws: {typical:.1f}), so the means do not tell the symbols "
            "apart; try a smaller KL weight (annealing=LinearAnnealing(0.01, 100), prior_strength=0.01) or "
            "plug_in='expected'"
        )]
    return []


def _held_out_decline(metrics: pd.DataFrame, column: str, tolerance: float) -> list:
    rows = metrics[["step", column]].dropna()
    if len(rows) < 2:
        return []
    best = rows[column].idxmax()
    best_step, best_value = rows.at[best, "step"], float(rows.at[best, column])
    last_step, last_value = rows["step"].iloc[-1], float(rows[column].iloc[-1])
    if best_step < last_step and last_value < best_value - tolerance:
        return [HeldOutDeclineWarning(
            f"held-out log-likelihood fell from {best_value:.4f} at step {best_step} to {last_value:.4f} at step "
            f"{last_step}; try keeping the best checkpoint (early stopping, patience) or fewer steps"
        )]
    return []


def _objective_mismatch(metrics, objective: str, log_likelihood: str, converged, tolerance: float, gap: float,
                        window: int) -> list:
    rows = metrics[["step", objective, log_likelihood]].dropna()
    if rows.empty:
        return []
    last_objective, last_log_likelihood = float(rows[objective].iloc[-1]), float(rows[log_likelihood].iloc[-1])
    stopped = "met its stopping rule" if converged else "ended"
    found = []
    if last_log_likelihood < last_objective - gap:
        found.append(f"the log-likelihood {last_log_likelihood:.4f} is {last_objective - last_log_likelihood:.3f} "
                     f"below the {objective} {last_objective:.4f} per observation")
    if len(rows) > window:
        objective_change = float(rows[objective].iloc[-1] - rows[objective].iloc[-1 - window])
        log_likelihood_change = float(rows[log_likelihood].iloc[-1] - rows[log_likelihood].iloc[-1 - window])
        if objective_change > 0 and log_likelihood_change < -tolerance:
            found.append(f"over the last {window} rows the {objective} rose by {objective_change:.4f} while the "
                         f"log-likelihood fell by {-log_likelihood_change:.4f}")
    if not found:
        return []
    return [ObjectiveMismatchWarning(
        f"the fit {stopped} on its {objective}, which disagrees with the log-likelihood: " + "; ".join(found)
        + "; try a smaller KL weight or plug_in='expected' for the tied head, and judge fits by the log-likelihood"
    )]
