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

:func:`diagnose_hops` reads what a head's hops choose (its ``hop_marginals(obs)``, ``(L, n, N)``, and the real
positions ``obs.full_mask()``): a **flat hop** (:class:`FlatHopWarning`), a hop that **copies** the previous
one (:class:`CopiedHopWarning`), a hop on one **fixed position** (:class:`FixedHopWarning`); it and
:func:`diagnose_starts` flag **starts that disagree** (:class:`StartsDisagreeWarning`). An SVI run that did
not get going warns :class:`TrainingStuckWarning` (:mod:`pyro_multihop.train.stuck`).

Each finding has a ``cause`` and a ``hint`` (what to try); :meth:`DiagnosticWarning.record` and
:func:`diagnostic_records` give them as results.json stores them: ``{"kind", "message", "hint"}``.

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
from typing import List, Optional, Sequence, Tuple

import pandas as pd
import torch

__all__ = [
    "DiagnosticWarning",
    "PosteriorCollapseWarning",
    "HeldOutDeclineWarning",
    "ObjectiveMismatchWarning",
    "TrainingStuckWarning",
    "FlatHopWarning",
    "CopiedHopWarning",
    "FixedHopWarning",
    "StartsDisagreeWarning",
    "posterior_spread",
    "diagnose_fit",
    "diagnose_hops",
    "diagnose_starts",
    "diagnostic_records",
    "issue",
]


class DiagnosticWarning(UserWarning):
    """Base class of the library's diagnostics: a ``cause`` and a ``hint`` (what to try), shown as
    ``"cause; hint"``; :meth:`record` is the finding as results.json stores it.

    :param str cause: what was found, with its numbers.
    :param str hint: what to try (may be empty).
    """

    #: The finding's name in records (``{"kind": ..., "message": ..., "hint": ...}``).
    kind = "diagnostic"

    def __init__(self, cause: str = "", hint: str = ""):
        super().__init__(f"{cause}; {hint}" if hint else cause)
        self.cause, self.hint = cause, hint

    def __reduce__(self):  # picklable across processes with its hint (Exception pickles ``args`` only)
        return type(self), (self.cause, self.hint)

    def record(self) -> dict:
        """``{"kind", "message", "hint"}``: this finding as results.json stores it."""
        return {"kind": self.kind, "message": self.cause, "hint": self.hint}


class PosteriorCollapseWarning(DiagnosticWarning):
    """The tied head's posterior sits at the prior: standard deviations near 1, means close together."""

    kind = "posterior_collapse"


class HeldOutDeclineWarning(DiagnosticWarning):
    """The held-out log-likelihood got worse after its best point."""

    kind = "held_out_decline"


class ObjectiveMismatchWarning(DiagnosticWarning):
    """The quantity a fit optimised (and stopped on) disagrees with the log-likelihood."""

    kind = "objective_mismatch"


class TrainingStuckWarning(DiagnosticWarning):
    """An SVI run did not get going: the divergence guard fired more than once (each time restoring the
    best parameters and cutting the learning rate), or the run ended near its starting loss."""

    kind = "training_stuck"


class FlatHopWarning(DiagnosticWarning):
    """A hop's posterior is flat: it spreads over the real positions instead of choosing one."""

    kind = "flat_hop"


class CopiedHopWarning(DiagnosticWarning):
    """A hop chooses the position the previous hop chose, on most rows."""

    kind = "copied_hop"


class FixedHopWarning(DiagnosticWarning):
    """A hop chooses one fixed position (e.g. the first fact) on most rows, whatever the row holds."""

    kind = "fixed_hop"


class StartsDisagreeWarning(DiagnosticWarning):
    """Several starts of one fit reach different accuracies: the result depends on the initialisation."""

    kind = "starts_disagree"


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
        tied head, the facts head with ``embedding_posterior="mean_field"``). Other heads, and point estimates
        (``embeddings()`` None, or its scale None), are accepted and give no posterior check.
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
    if posterior is not None and posterior[1] is not None:  # a point estimate (scale None) has no posterior
        found += _posterior_collapse(*posterior, collapse_scale, collapse_distance)
    if metrics is not None and held_out in metrics.columns:
        found += _held_out_decline(metrics, held_out, tolerance)
    if metrics is not None and objective is not None:
        for column in (objective, log_likelihood):
            if column not in metrics.columns:
                raise ValueError(f"metrics has no column {column!r}; columns are {list(metrics.columns)}")
        found += _objective_mismatch(metrics, objective, log_likelihood, converged, tolerance, gap, window)
    if warn:
        issue(found, stacklevel)
    return found


def issue(diagnostics, stacklevel: int = 2) -> None:
    """``warnings.warn`` each of ``diagnostics``, with the ``stacklevel`` its caller would give
    :func:`warnings.warn` (2: the caller's caller)."""
    for diagnostic in diagnostics:
        warnings.warn(diagnostic, stacklevel=stacklevel + 1)


def diagnostic_records(diagnostics) -> List[dict]:
    """``[{"kind", "message", "hint"}, ...]`` of ``diagnostics``: :class:`DiagnosticWarning` instances (their
    :meth:`~DiagnosticWarning.record`), or other warnings and strings (kind ``"diagnostic"``, no hint)."""
    records = []
    for diagnostic in diagnostics:
        if isinstance(diagnostic, DiagnosticWarning):
            records.append(diagnostic.record())
        else:
            records.append({"kind": DiagnosticWarning.kind, "message": str(diagnostic), "hint": ""})
    return records


def _posterior_collapse(mean, scale, collapse_scale: float, collapse_distance: float) -> list:
    spread, distance = posterior_spread(mean, scale)
    typical = math.sqrt(2.0 * mean.shape[-1])
    if spread > collapse_scale and distance < collapse_distance * typical:
        return [PosteriorCollapseWarning(
            f"posterior collapse: mean posterior sd {spread:.2f} (prior 1), mean pairwise distance of the "
            f"embedding means {distance:.2f} (prior draws: {typical:.1f}), so the means do not tell the symbols "
            "apart",
            "try a smaller KL weight (annealing=LinearAnnealing(0.01, 100), prior_strength=0.01) or plug_in='expected'",
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
            f"{last_step}",
            "try keeping the best checkpoint (early stopping, patience) or fewer steps",
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
        f"the fit {stopped} on its {objective}, which disagrees with the log-likelihood: " + "; ".join(found),
        "try a smaller KL weight or plug_in='expected' for the tied head, and judge fits by the log-likelihood",
    )]


# -- the hop posterior and the starts ---------------------------------------------------------------------
def diagnose_hops(
    hop_marginals: torch.Tensor,
    real: torch.Tensor,
    accuracies: Optional[Sequence[float]] = None,
    *,
    flat: float = 0.9,
    share: float = 0.8,
    fixed: float = 0.5,
    spread: float = 0.01,
    warn: bool = True,
    stacklevel: int = 2,
) -> List[DiagnosticWarning]:
    """Check what a fitted head's hops choose on some rows, and whether several starts agree; returns the
    findings (each a :class:`DiagnosticWarning` with a cause and a hint, :func:`diagnostic_records` makes
    them records) and, with ``warn``, issues each.

    - :class:`FlatHopWarning`: a hop's mean posterior entropy over the rows, each row's divided by the log
      of its number of real positions, is at least ``flat``: the hop spreads over the positions instead of
      choosing one (rows with a single real position are left out);
    - :class:`CopiedHopWarning`: hop ``l``'s MAP position equals hop ``l - 1``'s on at least ``share`` of
      the rows (neither hop flat);
    - :class:`FixedHopWarning`: one position is the hop's MAP position on at least ``fixed`` of the rows and on
      at least 1.5 times the share that chance gives it (the mean over the rows of ``1 / (real positions)`` where
      it is real: rows of two facts put a fair hop on position 0 half of the time), the hop not flat, as when a
      hop sits on each row's first fact (bAbI task 3's idle first hop: about 60 % of the rows, where the rows'
      facts differ);
    - :class:`StartsDisagreeWarning`: the ``accuracies`` of several starts span more than ``spread``
      (:func:`diagnose_starts`).

    :param hop_marginals: ``(L, n, N)``, ``p(z_l = i | row)`` (a head's ``hop_marginals(obs)``).
    :param real: ``(n, N)`` bool, the real positions (facts) of each row (``obs.full_mask()``).
    :param accuracies: optional accuracy of each start of one fit (at least two to compare).
    :param float flat: share of the largest entropy from which a hop counts as flat.
    :param float share: share of the rows on which a copied MAP position is flagged.
    :param float fixed: share of the rows on which one fixed MAP position is flagged (more than half: most rows).
    :param float spread: accuracy range over the starts that is flagged (0.01: more than a point).
    """
    marginals = torch.as_tensor(hop_marginals).detach().double()
    real = torch.as_tensor(real, dtype=torch.bool).detach().to(marginals.device)
    if marginals.dim() != 3:
        raise ValueError(f"hop_marginals must have shape (L, n, N), got {tuple(marginals.shape)}")
    if real.shape != marginals.shape[1:]:
        raise ValueError(f"real must have shape (n, N) = {tuple(marginals.shape[1:])}, got {tuple(real.shape)}")
    for name, value in (("flat", flat), ("share", share), ("fixed", fixed)):
        if not 0 < value <= 1:
            raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    found, flat_hops = [], set()
    probs = marginals.masked_fill(~real, 0.0)
    choices = probs.argmax(-1)  # (L, n)
    n_real = real.sum(-1)
    spreadable = n_real > 1
    for hop in range(marginals.shape[0]):
        if not spreadable.any():
            break
        entropy = -(probs[hop] * probs[hop].clamp_min(1e-300).log()).sum(-1)
        relative = float((entropy[spreadable] / n_real[spreadable].double().log()).mean())
        if relative >= flat:
            flat_hops.add(hop)
            found.append(FlatHopWarning(
                f"hop {hop + 1}'s posterior is flat: its mean entropy is {relative:.2f} of the largest (log of "
                "the number of real facts), so it attends every fact alike",
                "try a lower --lr (e.g. 0.03), more steps or more --starts; with supporting facts, check that "
                "the hop's question words can tell them apart",
            ))
    rows = choices.shape[1]
    for hop in range(marginals.shape[0]):
        if hop in flat_hops or rows == 0:
            continue
        if hop > 0 and hop - 1 not in flat_hops:
            same = float((choices[hop] == choices[hop - 1]).double().mean())
            if same >= share:
                found.append(CopiedHopWarning(
                    f"hop {hop + 1} chooses the fact hop {hop} chose on {same:.0%} of the rows, so the two hops "
                    "read one fact",
                    "try more --starts or a lower --lr; if the questions need fewer hops, fit fewer --hops",
                ))
        counts = torch.bincount(choices[hop], minlength=marginals.shape[2])
        position = int(counts.argmax())
        on_position = float(counts[position]) / rows
        chance = float((real[:, position] / n_real.clamp_min(1)).double().mean())
        if on_position >= max(fixed, 1.5 * chance):
            found.append(FixedHopWarning(
                f"hop {hop + 1} chooses position {position} on {on_position:.0%} of the rows, whatever they hold",
                "unless the data put that hop's fact there, try more --starts or a lower --lr (e.g. 0.03)",
            ))
    if accuracies is not None:
        found += diagnose_starts(accuracies, spread=spread, warn=False)
    if warn:
        issue(found, stacklevel)
    return found


def diagnose_starts(accuracies: Sequence[Optional[float]], *, spread: float = 0.01, warn: bool = True,
                    stacklevel: int = 2) -> List[DiagnosticWarning]:
    """:class:`StartsDisagreeWarning` when the ``accuracies`` of several starts of one fit (None or NaN
    left out; at least two) span more than ``spread`` (0.01: more than a point); returns the findings and,
    with ``warn``, issues them."""
    values = [float(a) for a in accuracies if a is not None and math.isfinite(float(a))]
    found = []
    if len(values) >= 2 and max(values) - min(values) > spread + 1e-9:  # 0.91 - 0.90 is a point, not more
        found.append(StartsDisagreeWarning(
            f"the {len(values)} starts disagree: accuracy from {min(values):.3f} to {max(values):.3f}, so the "
            "result depends on where a start begins",
            "keep the best start by held-out log-likelihood (fit_svi(starts=K), --starts K) and try more "
            "--starts or a lower --lr",
        ))
    if warn:
        issue(found, stacklevel)
    return found
