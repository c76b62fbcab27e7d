"""The random state of an SVI run: the torch generators a run forks, saves in its checkpoint and restores.

A seeded run draws from its own stream (``torch.random.fork_rng`` over :func:`rng_devices`), so that the
caller's global random state is left as it was; a checkpoint carries :func:`get_rng_state`, so that a resumed
run draws what the uninterrupted one would have drawn.
"""

from __future__ import annotations

import torch

__all__ = ["get_rng_state", "rng_devices", "set_rng_state"]


def rng_devices(device: torch.device) -> list:
    """The CUDA devices whose generators a run on ``device`` uses (none on the CPU)."""
    return [device.index or 0] if device.type == "cuda" else []


def get_rng_state(device: torch.device) -> dict:
    """``{"torch": CPU generator state}``, and ``"cuda"`` on a CUDA ``device``."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    """Restore what :func:`get_rng_state` returned."""
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
