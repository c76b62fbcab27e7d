"""The divergence guard of an SVI run: :class:`DivergenceGuard`.

The full-data loss is tracked (every step with full batches, where it comes for free; at logged steps with
mini-batches); if it rises more than ``divergence_threshold`` above the best value seen, the best parameters
are restored, Adam's moment estimates are reset and the learning rate is multiplied by
``divergence_lr_factor``. At the end of a run the best parameters are restored if the final ones are worse.
Events are listed in ``metrics.attrs["divergences"]``. The best value is only compared among steps whose
``model.svi_kwargs(step)`` agree (:func:`objective_key`: a KL-annealed objective changes every step while it
anneals).

The first ``divergence_warmup`` steps are a warm-up: Adam's first steps move every coordinate by about the
learning rate whatever its gradient, and at a large learning rate the loss often rises for a few steps before
it falls. During the warm-up no rise counts as a divergence (a non-finite loss still does), and at its end
the reference restarts: the best loss and parameters are those of the first observed step at or after
``divergence_warmup`` and the steps after it, so a restore never goes back to the warm-up (near the
initialisation, whose answers are those of an untrained head). Why 40 steps: ``docs/defaults.md``.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Optional

__all__ = ["DivergenceGuard", "objective_key"]

logger = logging.getLogger(__name__)


def _snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def objective_key(model, step: int) -> str:
    """What identifies the objective of step ``step``: its ``model.svi_kwargs(step)``, as a string."""
    return repr(sorted(model.svi_kwargs(step).items()))


class DivergenceGuard:
    """Best full-data loss, best parameters, divergence events.

    :param threshold: nats per observation above the best loss that count as a divergence (None or
        ``math.inf``: never).
    :param float lr_factor: learning-rate factor applied after a divergence.
    :param int warmup: steps at the start during which a rise is no divergence; the reference (best loss and
        parameters) restarts at the first observed step at or after it.
    """

    def __init__(self, threshold: Optional[float], lr_factor: float, warmup: int = 0):
        self.threshold = None if threshold is None or threshold == math.inf else float(threshold)
        self.lr_factor = lr_factor
        self.warmup = int(warmup)
        self.warming_up = self.warmup > 0
        self.best_loss = math.inf
        self.best_step = None
        self.best_state = None
        self.objective = None
        self.events = []

    def observe(self, step: int, loss: float, objective: str, model) -> bool:
        """Record the full-data ``loss`` after ``step`` steps; True if it is a divergence."""
        if objective != self.objective:
            self.objective, self.best_loss, self.best_step, self.best_state = objective, math.inf, None, None
        finite = math.isfinite(loss)
        if self.best_state is not None and self.threshold is not None:
            if not finite or (not self.warming_up and loss > self.best_loss + self.threshold):
                return True
        if not finite:
            raise FloatingPointError(f"the loss is {loss} at step {step}, before any finite value to restore")
        if self.warming_up and step >= self.warmup:  # the warm-up is over: the reference restarts here
            self.warming_up = False
            self.best_loss, self.best_step, self.best_state = loss, step, _snapshot(model)
        elif loss < self.best_loss:
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
        """What a checkpoint carries of the guard."""
        return {
            "best_loss": self.best_loss,
            "best_step": self.best_step,
            "best_state": self.best_state,
            "objective": self.objective,
            "events": list(self.events),
            "warming_up": self.warming_up,
        }

    def load(self, state: dict) -> None:
        """Restore what :meth:`state` returned."""
        self.best_loss = state["best_loss"]
        self.best_step = state["best_step"]
        self.best_state = state["best_state"]
        self.objective = state["objective"]
        self.events = list(state["events"])
        self.warming_up = bool(state.get("warming_up", False))  # checkpoints from before the warm-up: none
