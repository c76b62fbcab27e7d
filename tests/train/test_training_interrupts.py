"""SIGINT and SIGTERM during fit_svi (pyro_multihop.train.interrupts): the checkpoint holds the last completed
step, the handlers are restored, and without a checkpoint Ctrl-C interrupts at once."""

import os
import signal

import pytest
import torch

from pyro_multihop import transitive_task
from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.train import TrainingInterrupted, fit_svi
from svi_test_heads import small_head


def _send_at(signum, at_step):
    def callback(step, model, row):
        if step == at_step:
            os.kill(os.getpid(), signum)

    return callback


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_last_completed_step_and_restores_the_handlers(tmp_path, signum):
    obs = transitive_task(60, seed=0)
    path = tmp_path / "checkpoint.pt"
    before = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as caught:
        fit_svi(small_head(), obs, num_steps=30, log_every=10, progress=False, checkpoint=path,
                checkpoint_every=1000, callback=_send_at(signum, 10))
    assert (caught.value.step, caught.value.signum, caught.value.exit_status) == (11, signum, 128 + signum)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert load_checkpoint(path)[1]["step"] == 11
    assert signal.getsignal(signum) is before
    # Resumed, the run ends where an uninterrupted one does.
    resumed, reference = small_head(), small_head()
    metrics = fit_svi(resumed, obs, num_steps=30, log_every=10, progress=False, checkpoint=path)
    assert metrics.attrs["resumed_from"] == 11
    fit_svi(reference, obs, num_steps=30, log_every=10, progress=False)
    for name, value in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


def test_a_signal_after_the_last_step_finishes_the_run_then_reports_it(tmp_path):
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(TrainingInterrupted) as caught:
        fit_svi(small_head(), transitive_task(60, seed=0), num_steps=20, log_every=10, progress=False,
                checkpoint=path, callback=_send_at(signal.SIGTERM, 20))  # the final row is logged at step 20
    assert caught.value.step == 20
    assert load_checkpoint(path)[1]["extra"]["svi"]["finished"]


def test_without_a_checkpoint_ctrl_c_interrupts_at_once():
    # Python's own SIGINT handler, as in an interpreter the user runs (a pytest-xdist worker ignores SIGINT):
    # without a checkpoint fit_svi leaves it in place
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_without_a_checkpoint()
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_without_a_checkpoint():
    with pytest.raises(KeyboardInterrupt) as caught:
        fit_svi(small_head(), transitive_task(60, seed=0), num_steps=30, log_every=10, progress=False,
                callback=_send_at(signal.SIGINT, 10))
    assert not isinstance(caught.value, TrainingInterrupted)
