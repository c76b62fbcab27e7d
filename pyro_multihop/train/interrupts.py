"""SIGINT and SIGTERM during an SVI run: deferred to the end of the current step, then reported.

With a checkpoint, :func:`~pyro_multihop.fit_svi` runs its loop under :func:`deferred_interrupts`: a signal
only sets a flag that the loop checks between steps (:func:`agreed_signal`, the same decision on every rank),
so that the checkpoint is written at a completed step before :class:`TrainingInterrupted` is raised.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from .. import distributed

__all__ = ["TrainingInterrupted", "agreed_signal", "deferred_interrupts"]


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped :func:`~pyro_multihop.fit_svi` after a completed step; the checkpoint holds
    that step.

    ``signum`` is the signal, ``step`` the steps completed, ``checkpoint`` the file written;
    ``exit_status`` is the conventional ``128 + signum`` (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, step: int, checkpoint):
        super().__init__(f"{signal.Signals(signum).name} after step {step}; checkpoint written to {checkpoint}")
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_status = 128 + signum


@contextlib.contextmanager
def deferred_interrupts(enabled: bool):
    """While active, SIGINT and SIGTERM only set a flag (``received[0]`` = the signal number) that the
    training loop checks between steps; a second signal interrupts at once. Only in the main thread,
    where Python delivers signals; the previous handlers are restored on exit."""
    received = [None]
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handler(signum, frame):
        if received[0] is not None:
            raise KeyboardInterrupt
        received[0] = signum

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def agreed_signal(signum, checkpoint):
    """The signal to stop on: under a process group with a checkpoint, the one any rank received (one small
    all-reduce a step), so that every rank saves and stops at the same step (the save is collective)."""
    if checkpoint is None or not distributed.is_distributed():
        return signum
    return distributed.all_reduce_max(signum or 0) or None
