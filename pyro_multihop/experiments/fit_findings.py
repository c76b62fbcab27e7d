"""What the commands record and print about a fit: the records of its starts and its diagnostics.

``pyro-multihop train`` (summary.json), ``qa`` and ``babi`` (results.json) store :func:`fit_findings`:

- ``diagnostics``: the fit's findings, ``{"kind", "message", "hint"}`` records (``metrics.attrs["diagnostics"]``
  of :func:`~pyro_multihop.fit_svi`: a run that did not get going, a collapsed posterior, starts that
  disagree); the structured-facts head adds its hop diagnostics (:func:`hop_findings`);
- ``starts``, with ``--starts K`` for K > 1: one record per start (``start``, ``seed``,
  ``train_log_likelihood``, ``val_log_likelihood``, ``val_accuracy``, ``divergences``, ``diagnostics``,
  ``kept``), the kept one the highest held-out log-likelihood.

The commands print each finding as one line, :func:`diagnostic_line` (``warning: <message> (try: <hint>)``),
and pass on the fit's other warnings alone (:func:`pass_on_unrecorded`), so that no finding shows twice.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, List, Optional, Sequence

import torch

from ..diagnostics import DiagnosticWarning, diagnose_hops, diagnostic_records, issue

__all__ = ["diagnostic_line", "starts_line", "fit_findings", "hop_findings", "pass_on_unrecorded", "recorded_fit",
           "report_findings"]


def diagnostic_line(record: dict) -> str:
    """``warning: <message> (try: <hint>)`` of a ``{"kind", "message", "hint"}`` record (no ``(try: ...)``
    without a hint; a hint that starts with "try " loses it)."""
    hint = record.get("hint") or ""
    hint = hint[len("try "):] if hint.startswith("try ") else hint
    return f"warning: {record['message']}" + (f" (try: {hint})" if hint else "")


def starts_line(starts: Optional[Sequence[dict]]) -> Optional[str]:
    """A note on the starts of a fit (the records of ``metrics.attrs["starts"]``): which was kept and each
    start's held-out log-likelihood; None without starts."""
    if not starts:
        return None
    kept_record = next(record for record in starts if record["kept"])
    kept = kept_record["start"]
    if kept_record.get("start_from"):
        kept = f"{kept} ({kept_record['start_from']})"
    values = ", ".join("n/a" if record["val_log_likelihood"] is None or not math.isfinite(record["val_log_likelihood"])
                       else f"{record['val_log_likelihood']:.4f}" for record in starts)
    return (f"note: {len(starts)} starts, kept start {kept}: the highest held-out log-likelihood (starts 0.."
            f"{len(starts) - 1}: {values})")


def fit_findings(metrics) -> dict:
    """``{"diagnostics": [records], "starts": [records]}`` of a fit's metrics (:func:`~pyro_multihop.fit_svi`'s
    frame); ``starts`` only where the fit had several. A finished run resumed without training holds no
    diagnostics of its own: ``[]``."""
    findings = {"diagnostics": [dict(record) for record in metrics.attrs.get("diagnostics", [])]}
    if metrics.attrs.get("starts"):
        findings["starts"] = [dict(record) for record in metrics.attrs["starts"]]
    return findings


def hop_findings(head, data) -> List[DiagnosticWarning]:
    """The hop diagnostics (:func:`~pyro_multihop.diagnostics.diagnose_hops`: flat, copied and fixed hops) of
    the structured-facts ``head`` on the questions of ``data`` (a :class:`~pyro_multihop.datasets.qa_jsonl.QAData`).

    They read the question-only hop marginals ``p(z_l | facts, question)``
    (:func:`~pyro_multihop.experiments.qa_apply.question_only_marginals`): what the model attends when it
    answers (the predictions' ``facts`` are their most probable path), not the posterior given the answer,
    which the answer alone can make look sharp. Returned, not warned."""
    from .qa_apply import question_only_marginals  # qa_apply imports qa, which imports this module

    with torch.no_grad():
        marginals = question_only_marginals(head, data.obs)
    return diagnose_hops(marginals, data.obs.full_mask().cpu(), warn=False)


def pass_on_unrecorded(caught, records: Sequence[dict], skip: tuple = ()) -> None:
    """Issue again the ``caught`` warnings (``warnings.catch_warnings(record=True)``) that are not among
    ``records`` (the findings the command prints as notes) and not of a category in ``skip``."""
    recorded = {(record["kind"], record["message"]) for record in records}
    for caught_warning in caught:
        message = caught_warning.message
        if isinstance(message, DiagnosticWarning) and (message.kind, message.cause) in recorded:
            continue
        if skip and issubclass(caught_warning.category, skip):
            continue
        warnings.warn_explicit(message, caught_warning.category, caught_warning.filename, caught_warning.lineno)


def recorded_fit(fit: Callable, log: Optional[Callable[[str], None]] = None) -> tuple:
    """``(metrics, findings)``: ``metrics = fit()`` (a :func:`~pyro_multihop.fit_svi` call) and its
    :func:`fit_findings`. With ``log`` the fit's warnings are caught: its findings are for
    :func:`report_findings` to log, the others are passed on (:func:`pass_on_unrecorded`); without, every
    warning reaches the caller as the fit issued it."""
    if log is None:
        metrics = fit()
        return metrics, fit_findings(metrics)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = fit()
    findings = fit_findings(metrics)
    pass_on_unrecorded(caught, findings["diagnostics"])
    return metrics, findings


def report_findings(findings: dict, log: Optional[Callable[[str], None]] = None, more=(), stacklevel: int = 2) -> dict:
    """Add the findings ``more`` (:class:`~pyro_multihop.diagnostics.DiagnosticWarning` s found after the fit,
    such as :func:`hop_findings`) to ``findings["diagnostics"]``; with ``log``, log :func:`starts_line` and
    every diagnostic as :func:`diagnostic_line`; without, warn ``more`` (the fit warned its own) at
    ``stacklevel`` (as :func:`warnings.warn`'s, 2: this function's caller's caller). Returns ``findings``."""
    more = list(more)
    findings["diagnostics"] = list(findings["diagnostics"]) + diagnostic_records(more)
    if log is None:
        issue(more, stacklevel=stacklevel + 1)
        return findings
    lines = [starts_line(findings.get("starts"))] + [diagnostic_line(record) for record in findings["diagnostics"]]
    for line in lines:
        if line is not None:
            log(line)
    return findings
