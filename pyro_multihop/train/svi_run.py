"""One SVI run of :func:`~pyro_multihop.fit_svi`: :class:`SviRun`, the loop, its metrics, its checkpoint and
the resume from it.

A checkpoint carries what the run needs to continue as if it had not stopped: parameters, optimiser state
(and so the learning rate), the random state of every rank, the divergence guard, the held-out record and the
metric rows so far. Under a process group rank 0 reads and writes it, and every rank gets its contents.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

import pandas as pd

from .. import distributed
from ..checkpoint import CheckpointError, load_parameters, read_checkpoint, save_checkpoint
from ..diagnostics import diagnose_fit, diagnostic_records, issue
from ..runs import progress_bar
from .divergence_guard import DivergenceGuard, objective_key
from .interrupts import TrainingInterrupted, agreed_signal, deferred_interrupts
from .random_state import get_rng_state, set_rng_state
from .settings import make_optimizer
from .stuck import training_stuck
from .svi_loss import SviLoss, backward_over_ranks
from .validation import ValidationRecord, warn_if_overfitting

__all__ = ["SviRun"]

logger = logging.getLogger(__name__)


class SviRun:
    """One SVI run's state: the optimiser, the divergence guard, the metric rows, the held-out record, and
    where the run started (a resumed checkpoint's step) and what it saves.

    :meth:`resume` restores a checkpoint (returning the metrics of a finished one), :meth:`run` takes the
    steps; each step is :meth:`take_step`, each logged row :meth:`log_row`, each save :meth:`save`. The
    arguments are :func:`~pyro_multihop.fit_svi`'s, checked, with ``settings`` from
    :func:`~pyro_multihop.train.settings.svi_settings`."""

    def __init__(self, model, loss: SviLoss, settings: dict, device, *, val, patience, progress, callback,
                 checkpoint, checkpoint_every, best_checkpoint):
        self.model, self.loss, self.settings, self.device = model, loss, settings, device
        self.val, self.callback, self.progress = val, callback, progress
        self.checkpoint, self.best_checkpoint = checkpoint, best_checkpoint
        self.checkpoint_every = checkpoint_every or max(1, settings["num_steps"] // 10)
        self.optimizer = make_optimizer(model, settings)
        self.guard = DivergenceGuard(settings["divergence_threshold"], settings["divergence_lr_factor"],
                                     settings["divergence_warmup"])
        self.validation = None if val is None else ValidationRecord(patience)
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
        set_rng_state(_own_rng_state(training, self.checkpoint), self.device)
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
        """The run's state after ``step`` steps, to ``checkpoint`` (written by rank 0)."""
        rng = get_rng_state(self.device)
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
        objective = objective_key(self.model, step)
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
        backward_over_ranks(training_loss, self.model)
        stop = logged and self.log_row(step, full)
        optimizer.step()
        return stop

    # -- the loop ------------------------------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        """Take the steps from ``start`` to ``num_steps`` (or to a stop); the metrics frame of
        :func:`~pyro_multihop.fit_svi`."""
        num_steps, checkpoint = self.settings["num_steps"], self.checkpoint
        distributed.broadcast_module(self.model)  # every rank starts from rank 0's parameters
        self.started = time.perf_counter() - self.elapsed_before
        show = self.progress and distributed.rank() == 0
        last = self.start
        with deferred_interrupts(checkpoint is not None) as received, \
                progress_bar(num_steps, initial=self.start, desc="svi", unit="step", enabled=show) as self.bar:
            for step in range(self.start, num_steps):
                signum = agreed_signal(received[0], checkpoint)
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
            diverged = self.guard.observe(last, final_loss, objective_key(self.model, last), self.model)
            self.log_row(last, final_loss)
            late_signal = agreed_signal(received[0], checkpoint)  # arrived after the last step: finish, save, report
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
        warn_if_overfitting(metrics, stacklevel=4)  # fit_svi's caller
        # The head's own checks (posterior collapse of the tied head's embeddings; the held-out decline is
        # OverfittingWarning's, above) and whether the run got going.
        found = diagnose_fit(self.model, None, warn=False)
        found += training_stuck(self.guard.events, self.start_loss(last), guard.best_loss if restored else final_loss,
                                last, self.settings)
        issue(found, stacklevel=3)  # fit_svi's caller
        metrics.attrs["diagnostics"] = diagnostic_records(found)
        return metrics

    def start_loss(self, last: int):
        """The logged full-data loss at step 0, if its objective is that of step ``last`` (else None)."""
        first = self.rows[0] if self.rows else None
        if first is None or first["step"] != 0 or objective_key(self.model, 0) != objective_key(self.model, last):
            return None
        return float(first["loss"])

    def metrics(self, final_loss, restored) -> pd.DataFrame:
        """The metrics frame: the logged rows, and the run's summary in ``attrs``."""
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
