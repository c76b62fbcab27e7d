"""EM training runs as the ``train`` command makes them: a metrics frame, a checkpoint, settings, notes.

:func:`run_chained_em` (closed-form EM, :class:`~pyro_multihop.em.ChainedEM`) and :func:`run_variational_em`
(:class:`~pyro_multihop.em.TiedEmbeddingVEM`) return an :class:`EMRun`; the command only prints its notes.
The checkpoint schema of an EM run is ``extra = {"method": "em", "em": settings}`` (``settings["method"]`` is
``"variational em"`` for the tied head); :func:`training_method` reads back which method wrote a checkpoint,
whatever wrote it (SVI, EM, variational EM, a bAbI run).

Metrics frames: one row per iteration, the columns of :func:`~pyro_multihop.train.fit_svi` (``step``,
``loss``, ``val_log_likelihood``, ``val_accuracy``, ``seconds``). For closed-form EM ``loss`` is the exact
negative log-likelihood per observation; for variational EM it is the negative *annealed ELBO* per observation
(``attrs["loss_label"]`` says so, and the figures use it), and the held-out columns are filled at the last
iteration only.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import List, NamedTuple, Optional

import pandas as pd

from .. import distributed
from ..checkpoint import save_checkpoint
from ..checks import renamed_keyword
from . import ChainedEM, ConvergenceWarning, TiedEmbeddingVEM

__all__ = ["EMRun", "run_chained_em", "run_variational_em", "training_method", "LOSS_LABELS", "CHAINED_EM_MAX_ITERS"]

#: Most closed-form EM iterations of :func:`run_chained_em` (the ``train`` command's default).
CHAINED_EM_MAX_ITERS = 100

#: y-axis labels of the ``loss`` column, by method.
LOSS_LABELS = {
    "svi": "negative log-likelihood per observation (nats)",
    "em": "negative log-likelihood per observation (nats)",
    "variational em": "negative annealed ELBO per observation (nats)",
}


class EMRun(NamedTuple):
    """What an EM run gives the command.

    :ivar model: the fitted head.
    :ivar metrics: the metrics frame (module docstring).
    :ivar settings: JSON-serialisable settings and outcome (``n_iter``, ``converged``, ...), as saved.
    :ivar notes: one-line remarks for the user (non-convergence).
    """

    model: object
    metrics: pd.DataFrame
    settings: dict
    notes: List[str]


def _held_out(model, val) -> dict:
    result = distributed.evaluate(model, val)
    return {"val_log_likelihood": result["log_likelihood"], "val_accuracy": result["accuracy"]}


def run_chained_em(train, val, *, n_hops: Optional[int] = None, num_symbols: int, num_targets: int,
                   sigma2: float = 0.1, max_iters: int = CHAINED_EM_MAX_ITERS, tol: float = 1e-6, seed: int = 0,
                   dtype=None, device=None, checkpoint=None, hops: Optional[int] = None) -> EMRun:
    """Closed-form EM of a chained head of ``n_hops`` hops (required; ``hops=``, its old keyword, is deprecated)
    on ``train`` (``val`` evaluated every iteration); the best model is saved to ``checkpoint`` (by rank 0 under a
    process group)."""
    n_hops = renamed_keyword("run_chained_em", "n_hops", n_hops, "hops", hops)
    em = ChainedEM(n_hops, num_symbols, num_targets, sigma2=sigma2)
    if device is not None:
        train = train.to(device)
        val = None if val is None else val.to(device)
    rows, started = [], time.perf_counter()

    def callback(iteration, model, stats):
        row = {"step": iteration, "loss": -stats.loglik / stats.n}
        if val is not None:
            row.update(_held_out(model, val))
        row["seconds"] = time.perf_counter() - started
        rows.append(row)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        result = em.fit(train, max_iters=max_iters, tol=tol, seed=seed, callback=callback, dtype=dtype)
    notes = []
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        notes.append(f"note: EM did not converge in {max_iters} iterations (tol {tol:g}); the best model is kept")
    metrics = pd.DataFrame(rows)
    metrics.attrs.update({"best_step": result.best_iteration, "converged": result.converged,
                          "loss_label": LOSS_LABELS["em"]})
    settings = {"method": "em", "max_iters": max_iters, "tol": tol, "seed": seed, "sigma2": sigma2,
                "emission_smoothing": em.emission_smoothing, "n_iter": result.n_iter,
                "converged": result.converged, "best_iteration": result.best_iteration}
    if checkpoint is not None and distributed.rank() == 0:
        save_checkpoint(checkpoint, result.model, step=result.n_iter, extra={"method": "em", "em": settings})
    return EMRun(result.model, metrics, settings, notes)


def run_variational_em(train, val, *, n_hops: Optional[int] = None, num_symbols: int, num_targets: int,
                       embed_dim: int = 8, sigma2: float = 0.3, max_iters: Optional[int] = None,
                       lr: Optional[float] = None, seed: int = 0, checkpoint=None,
                       hops: Optional[int] = None) -> EMRun:
    """Variational EM of a tied-embedding head of ``n_hops`` hops (required; ``hops=``, its old keyword, is
    deprecated) on ``train``; ``val`` is evaluated once, at the end. Non-convergence is read from
    :class:`~pyro_multihop.em.ConvergenceWarning`."""
    n_hops = renamed_keyword("run_variational_em", "n_hops", n_hops, "hops", hops)
    options = {"sigma2": sigma2, "seed": seed}
    if lr is not None:
        options["lr"] = lr
    if max_iters is not None:
        options["max_iters"] = max_iters
    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        vem = TiedEmbeddingVEM(num_symbols, embed_dim, num_targets, n_hops, **options).fit(train)
    for warning in caught:  # pass the others on
        if not issubclass(warning.category, ConvergenceWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    notes = []
    if any(issubclass(w.category, ConvergenceWarning) for w in caught):
        notes.append(f"note: variational EM stopped at max_iters = {vem.max_iters} before its ELBO settled")
    model = vem.to_head()
    # ``loss`` is what variational EM optimises (the negative annealed ELBO per observation); the plug-in
    # training log-likelihood beside it is what its stopping rule and its diagnostics read.
    rows = [{"step": i + 1, "loss": -elbo, "train_log_likelihood": log_likelihood}
            for i, (elbo, log_likelihood) in enumerate(zip(vem.elbos_.tolist(), vem.log_likelihoods_.tolist()))]
    if val is not None and rows:
        for row in rows:
            row["val_log_likelihood"], row["val_accuracy"] = math.nan, math.nan
        rows[-1].update(_held_out(model, val))
    for row in rows:
        row["seconds"] = math.nan
    if rows:
        rows[-1]["seconds"] = time.perf_counter() - started
    metrics = pd.DataFrame(rows)
    metrics.attrs["loss_label"] = LOSS_LABELS["variational em"]
    settings = {"method": "variational em", "sigma2": sigma2, "seed": seed, "max_iters": vem.max_iters,
                "n_iter": vem.n_iter_, "converged": vem.converged_}
    if checkpoint is not None and distributed.rank() == 0:
        save_checkpoint(checkpoint, model, step=vem.n_iter_, extra={"method": "em", "em": settings})
    return EMRun(model, metrics, settings, notes)


def training_method(state: dict) -> str:
    """How the checkpoint ``state`` (:func:`~pyro_multihop.checkpoint.read_checkpoint`) was trained:
    ``"SVI"``, ``"EM"``, ``"variational EM"``, with ``"bAbI task t, "`` before it for a bAbI run, or
    ``"unknown method"``."""
    extra = state.get("extra") or {}
    if extra.get("method") == "em":
        method = "variational EM" if (extra.get("em") or {}).get("method") == "variational em" else "EM"
    elif "svi" in extra or "svi_best" in extra or extra.get("method") == "svi":
        method = "SVI"
    else:
        method = "unknown method"
    if "task" in extra:
        return f"bAbI task {extra['task']}, {method}"
    return method
