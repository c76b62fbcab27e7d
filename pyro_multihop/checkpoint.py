"""Checkpoints: a head's configuration and parameters, and optionally its optimiser and training state, in one file.

A checkpoint is a plain dictionary written with :func:`torch.save` and read back with
``torch.load(weights_only=True)``, so loading one never runs pickled code::

    {
        "format": "pyro-multihop-checkpoint", "version": 1,
        "model_class": "ChainedAttention",      # a name of MODEL_CLASSES
        "config": {...},                        # model.config(), the constructor arguments
        "dtype": "float32",                     # dtype of the parameters
        "state_dict": {...},                    # model.state_dict()
        "optimizer": {...} or None,             # optimizer.state_dict()
        "step": 0,                              # optimisation steps taken
        "extra": {...},                         # anything else: tensors, numbers, strings, lists, dicts
    }

Writes are atomic: the file is written next to its destination under a temporary name, flushed to disk
and renamed over the destination, so a crash leaves either the old checkpoint or the new one.

Example::

    >>> import tempfile, os
    >>> from pyro_multihop import ChainedAttention
    >>> from pyro_multihop.checkpoint import save_checkpoint, load_checkpoint
    >>> head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
    >>> path = os.path.join(tempfile.mkdtemp(), "head.pt")
    >>> _ = save_checkpoint(path, head, step=10, extra={"note": "example"})
    >>> restored, state = load_checkpoint(path)
    >>> state["step"], state["extra"]["note"], bool((restored.key_tables == head.key_tables).all())
    (10, 'example', True)
"""

from __future__ import annotations

import importlib
import os
import tempfile
from pathlib import Path
from typing import Optional, Union

import torch

__all__ = ["MODEL_CLASSES", "model_class", "save_checkpoint", "load_checkpoint", "CheckpointError", "current_parameter_names"]

FORMAT = "pyro-multihop-checkpoint"
_ZIP_MAGIC = b"PK\x03\x04"
VERSION = 1

#: Heads a checkpoint can rebuild: class name -> "module:attribute". Modules are imported on first use,
#: so a head whose module is missing only fails when a checkpoint of it is loaded.
MODEL_CLASSES = {
    "ChainedAttention": "pyro_multihop.models.chained:ChainedAttention",
    "TiedEmbeddingAttention": "pyro_multihop.models.tied:TiedEmbeddingAttention",
    "FactAttention": "pyro_multihop.models.facts:FactAttention",
}

_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


class CheckpointError(ValueError):
    """A file is not a readable pyro-multihop checkpoint, or does not fit the model it is loaded into."""


def model_class(name: str) -> type:
    """The head class registered as ``name`` in :data:`MODEL_CLASSES` (imported on demand)."""
    if name not in MODEL_CLASSES:
        raise CheckpointError(f"model_class must be one of {sorted(MODEL_CLASSES)}, got {name!r}")
    module_name, attribute = MODEL_CLASSES[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise CheckpointError(f"model class {name!r} is not available: {error}") from None
    return getattr(module, attribute)


def _dtype_name(model: torch.nn.Module) -> str:
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) > 1:
        raise CheckpointError(f"model parameters must share one dtype, got {sorted(str(d) for d in dtypes)}")
    dtype = dtypes.pop() if dtypes else torch.get_default_dtype()
    return str(dtype).replace("torch.", "")


def _registered_name(model) -> str:
    name = type(model).__name__
    if name not in MODEL_CLASSES:
        raise CheckpointError(f"model must be one of {sorted(MODEL_CLASSES)}, got {name}")
    return name


def _cpu(value):
    """``value`` with every tensor moved to the CPU (nested dicts, lists and tuples)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def save_checkpoint(
    path: Union[str, os.PathLike],
    model,
    optimizer: Optional[torch.optim.Optimizer] = None,
    *,
    step: int = 0,
    extra: Optional[dict] = None,
) -> Path:
    """Write ``model`` (and ``optimizer``, ``step``, ``extra``) to ``path`` atomically.

    :param path: destination file; its folder must exist.
    :param model: a head registered in :data:`MODEL_CLASSES`, with ``config()``.
    :param optimizer: optional optimiser whose ``state_dict()`` is stored.
    :param int step: optimisation steps taken so far.
    :param dict extra: more state; only tensors, numbers, strings, None, and lists/tuples/dicts of them
        survive ``torch.load(weights_only=True)``.
    :returns: the path written.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise CheckpointError(f"checkpoint folder {str(path.parent)!r} does not exist")
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "model_class": _registered_name(model),
        "config": dict(model.config()),
        "dtype": _dtype_name(model),
        "state_dict": _cpu(dict(model.state_dict())),
        "optimizer": None if optimizer is None else _cpu(optimizer.state_dict()),
        "step": int(step),
        "extra": _cpu(dict(extra or {})),
    }
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(payload, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    return path


def read_checkpoint(path: Union[str, os.PathLike]) -> dict:
    """The raw checkpoint dictionary at ``path``, validated (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for foreign or damaged files
        raise CheckpointError(_unreadable(path, error)) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{str(path)!r} is not a pyro-multihop checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {str(path)!r} has version {payload.get('version')!r}, expected {VERSION}")
    missing = [k for k in ("model_class", "config", "dtype", "state_dict", "step") if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {str(path)!r} lacks the entries {missing}")
    if payload["dtype"] not in _DTYPES:
        raise CheckpointError(f"checkpoint dtype must be one of {sorted(_DTYPES)}, got {payload['dtype']!r}")
    return payload


def _unreadable(path: Path, error: Exception) -> str:
    """One sentence on why ``torch.load`` failed: not a checkpoint at all, refused objects, or damaged."""
    with open(path, "rb") as stream:
        head = stream.read(4)
    if head != _ZIP_MAGIC:  # torch.save writes a zip archive; anything else (a .csv, say) is another file
        return f"{str(path)!r} is not a checkpoint (train writes OUT/checkpoint.pt)"
    if "weights only" in str(error).lower() or "weights_only" in str(error):
        return f"{str(path)!r} is not a readable checkpoint: it holds objects other than tensors and plain containers"
    return f"checkpoint {str(path)!r} is truncated or damaged"


def build_model(payload: dict):
    """Rebuild the head of a checkpoint dictionary: constructor from ``config``, then its parameters."""
    cls = model_class(payload["model_class"])
    # Constructors may draw random initial values; keep the caller's random stream untouched.
    with torch.random.fork_rng(devices=[]):
        try:
            model = cls(**payload["config"])
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"cannot rebuild {payload['model_class']} from {payload['config']}: {error}") from None
    model = model.to(_DTYPES[payload["dtype"]])
    load_parameters(model, payload)
    return model


def load_parameters(model, payload: dict) -> None:
    """Copy the parameters of a checkpoint dictionary into ``model`` (same class and configuration)."""
    name = type(model).__name__
    if name != payload["model_class"]:
        raise CheckpointError(f"checkpoint holds a {payload['model_class']}, the model is a {name}")
    if dict(model.config()) != dict(payload["config"]):
        raise CheckpointError(f"checkpoint configuration {payload['config']} differs from the model's {model.config()}")
    try:
        model.load_state_dict(current_parameter_names(model, payload["state_dict"]))
    except RuntimeError as error:
        raise CheckpointError(f"checkpoint parameters do not fit the model: {str(error).splitlines()[0]}") from None


def current_parameter_names(model, state_dict: dict) -> dict:
    """``state_dict`` with the parameter names of checkpoints written before the rename: an unconstrained
    parameter used to be stored as ``NAME_unconstrained`` (a ``PyroParam``) and is now the plain
    ``torch.nn.Parameter`` ``NAME`` (``key_tables``, ``emission_logits``, ``guide.loc``). Names the model
    has are kept as they are."""
    expected = set(model.state_dict())
    suffix = "_unconstrained"
    renamed = {}
    for name, value in state_dict.items():
        if name not in expected and name.endswith(suffix) and name[: -len(suffix)] in expected:
            name = name[: -len(suffix)]
        renamed[name] = value
    return renamed


def load_checkpoint(path: Union[str, os.PathLike]):
    """Read a checkpoint written by :func:`save_checkpoint`.

    :returns: ``(model, state)``: the rebuilt head (on the CPU, in the stored dtype) and a dict with
        ``step``, ``optimizer`` (a state dict or None), ``extra``, ``config``, ``model_class``, ``dtype``.
    :raises CheckpointError: (a ``ValueError``) naming the problem if the file is missing, not a
        checkpoint, or holds a model that cannot be rebuilt.
    """
    payload = read_checkpoint(path)
    model = build_model(payload)
    state = {k: payload.get(k) for k in ("step", "optimizer", "extra", "config", "model_class", "dtype")}
    state["extra"] = state["extra"] or {}
    return model, state
