"""Shared test set-up: float64 oracles live in ``tests/oracle.py`` (importable as ``oracle``)."""

import os
import sys

import matplotlib
import pyro
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
matplotlib.use("Agg")
# The suite's tensors are small: one thread is faster than two on a 2-core machine, and timing-stable. The
# processes it starts (doc blocks, notebook kernels, commands, torchrun workers) inherit one thread too: with
# ``pytest -n 2`` both cores are busy, and a child's second thread only contends (a notebook's variational EM ran
# 10x slower with two).
torch.set_num_threads(1)
for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"


@pytest.fixture(autouse=True)
def _fresh_pyro_state():
    """Every test starts with an empty param store and a fixed seed."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()
