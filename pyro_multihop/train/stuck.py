"""When an SVI run did not get going: :func:`training_stuck`, which :class:`~pyro_multihop.train.svi_run.SviRun`
asks at the end of every run, and the :class:`~pyro_multihop.diagnostics.TrainingStuckWarning` it returns.

Two signs, each with its cause and what to try:

- the divergence guard fired more than once: each time it restored the best parameters and cut the
  learning rate, so the run went on at a fraction of the step it was given, often from near its start (the
  learning rate is too large for this data: the hint names a third of it);
- the loss of the parameters the run kept is within :data:`STUCK_SHARE` of its step-0 loss, after at least
  the guard's warm-up: the fit hardly moved from its initialisation (a saddle, or a learning rate far too
  small or cut too often). More starts (``starts=K``) perturb the initialisation.
"""

from __future__ import annotations

import math
from typing import List, Optional

from ..diagnostics import TrainingStuckWarning

__all__ = ["STUCK_SHARE", "suggested_lr", "training_stuck"]

#: A run whose kept loss is within this share of its step-0 loss (per observation) counts as stuck.
STUCK_SHARE = 0.01


def suggested_lr(lr: float) -> float:
    """A learning rate to try instead of ``lr`` after repeated divergences: a third of it, to one significant
    digit (0.1 -> 0.03)."""
    third = lr / 3.0
    return float(f"{third:.1g}")


def training_stuck(events: list, start_loss: Optional[float], kept_loss: float, steps: int,
                   settings: dict) -> List[TrainingStuckWarning]:
    """The signs that a run is stuck (see the module docstring), each a :class:`TrainingStuckWarning`.

    :param events: the guard's divergence events (``metrics.attrs["divergences"]``).
    :param start_loss: the full-data loss at step 0 per observation, None where it is unknown or belongs to
        another objective than ``kept_loss`` (a KL-annealed objective).
    :param float kept_loss: the loss of the parameters the run ends with.
    :param int steps: steps taken.
    :param dict settings: the run's settings (``lr``, ``divergence_warmup``).
    """
    found = []
    more_starts = "or more starts (--starts, starts=), e.g. 5"
    if len(events) > 1:
        where = ", ".join(str(event["step"]) for event in events[:6]) + (", ..." if len(events) > 6 else "")
        found.append(TrainingStuckWarning(
            f"the divergence guard fired {len(events)} times (steps {where}), each time restoring the best "
            f"parameters and cutting the learning rate, which ended at {events[-1]['lr']:.2g}: the steps are too "
            "large for this data, and the run went on with far smaller ones",
            f"lower the learning rate (--lr, lr=), e.g. {suggested_lr(settings['lr']):g}, {more_starts}",
        ))
    if (start_loss is not None and math.isfinite(start_loss) and math.isfinite(kept_loss)
            and steps >= max(1, settings["divergence_warmup"])
            and kept_loss > start_loss - STUCK_SHARE * abs(start_loss)):
        if events:
            hint = f"lower the learning rate (--lr, lr=), e.g. {suggested_lr(settings['lr']):g}, {more_starts}"
        else:
            hint = (f"try more starts (--starts, starts=), e.g. 5, more steps, or another learning rate "
                    f"(--lr, lr=; it was {settings['lr']:g})")
        found.append(TrainingStuckWarning(
            f"the training loss ended at {kept_loss:.4f} per observation, within {STUCK_SHARE:.0%} of its "
            f"{start_loss:.4f} at step 0: the fit hardly moved from its initialisation",
            hint,
        ))
    return found
