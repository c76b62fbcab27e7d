"""The files of the ``pyro-multihop`` commands: data files, checkpoints and the torch device read with errors of
one line (:class:`CommandError`), JSON and figures written.

What :mod:`pyro_multihop.experiments.train_files` and :mod:`pyro_multihop.experiments.apply_checkpoint` share;
the command (:mod:`pyro_multihop.cli`) prints a :class:`CommandError` as one line and exits with status 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from ..checkpoint import load_checkpoint
from ..data import Observations, read_columns

__all__ = ["CommandError", "torch_device", "load_data", "load_context", "load_model", "check_fits",
           "checkpoint_words", "write_json", "save_figure"]


class CommandError(Exception):
    """A problem with the user's files or arguments: printed as one line, exit status 2."""


def torch_device(text: str) -> torch.device:
    """The torch device named ``text`` (``--device``), refused when this machine lacks it."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CommandError(f"--device must be a torch device such as cpu or cuda:0, got {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError(f"--device {text}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise CommandError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) present")
    return device


def load_data(path: Path, shard: Optional[tuple] = None) -> Observations:
    """:meth:`Observations.load` of a data file (only rows of ``shard = (rank, world_size)`` if given); its
    errors name the file, row, line and cell."""
    if not path.is_file():
        raise CommandError(f"data file {str(path)!r} does not exist")
    return Observations.load(path, shard)


def load_context(path: Path) -> tuple:
    """``(Observations, has_target)`` of a data file whose target column is optional (0 where absent)."""
    if not path.is_file():
        raise CommandError(f"data file {str(path)!r} does not exist")
    has_target = "target" in read_columns(path)
    return Observations.load(path, allow_missing_target=True), has_target


def load_model(path: Path, device: torch.device) -> tuple:
    """``(model on device, state)`` of a checkpoint (:func:`~pyro_multihop.checkpoint.load_checkpoint`)."""
    model, state = load_checkpoint(path)
    return model.to(device), state


def check_fits(model, obs, path: Path) -> None:
    """Refuse a data file whose symbols or targets lie beyond the checkpoint's vocabulary, with a hint."""
    try:
        model.check_observations(obs)
    except (ValueError, TypeError) as error:
        raise CommandError(f"data file {str(path)!r} does not fit the checkpoint's model: {error}"
                           f"{_vocabulary_hint(error)}") from None


def _vocabulary_hint(error: Exception) -> str:
    """A hint for data with symbols beyond a trained vocabulary: the vocabulary is fixed by training."""
    text = str(error)
    if "num_symbols" in text or "num_targets" in text:
        return ("; the vocabulary is fixed when a model is trained (by default the largest symbol of the training "
                "file + 1): retrain with train --symbols S (and --targets T) large enough for every file")
    return ""


def checkpoint_words(state: dict) -> Optional[dict]:
    """The checkpoint's words ``{"symbols": [...], "targets": [...]}``, or None: from ``extra["vocabulary"]``
    (bAbI runs: symbols and targets), else from a checkpoint-level ``vocabulary`` (the symbols' words)."""
    vocabulary = (state.get("extra") or {}).get("vocabulary") or state.get("vocabulary")
    if isinstance(vocabulary, (list, tuple)):
        vocabulary = {"symbols": list(vocabulary), "targets": None}
    return vocabulary or None


def write_json(path: Path, payload: dict) -> None:
    """``payload`` as indented JSON (paths and tuples as strings and lists); creates the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def save_figure(figure, path: Path) -> Path:
    """Save a matplotlib figure as a PNG at ``path``; returns ``path``."""
    # bbox_inches="tight" keeps every label inside the PNG (colourbar ticks, long titles).
    figure.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    return path
