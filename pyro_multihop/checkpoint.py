"""Checkpoints: a head's configuration and parameters, and optionally its optimiser and training state, in one file.

A checkpoint is a plain dictionary written with :func:`torch.save` and read back with
``torch.load(weights_only=True)``, so loading one never runs pickled code::

    {
        "format": "pyro-multihop-checkpoint", "version": 1,
        "model_class": "ChainedAttention",      # a name of models.registry.HEAD_CLASSES
        "config": {...},                        # model.config(), the constructor arguments
        "dtype": "float32",                     # dtype of the parameters
        "state_dict": {...},                    # model.state_dict()
        "optimizer": {...} or None,             # optimizer.state_dict()
        "step": 0,                              # optimisation steps taken
        "extra": {...},                         # anything else: tensors, numbers, strings, lists, dicts
        "vocabulary": [...] or None,            # optional: the text of each symbol (index = symbol)
        "sha256": "...",                        # digest of model_class, config, dtype, step, vocabulary, state_dict
    }

Loading is strict: every entry of the right type, every parameter of the model present under its name, of
the model's dtype and shape and finite; a refusal is a :class:`CheckpointError` naming the file and the entry
or parameter. Checkpoints from before parameters were renamed (``key_tables_unconstrained``) are refused
with a sentence saying how to rename their entries. The ``sha256`` digest, verified on load, catches a bit
flipped in the parameters or the configuration (torch's zip archive has no checksum of its own); the
optimiser state and ``extra`` are not covered. A file without a digest (written before it existed) loads.

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

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

__all__ = ["model_class", "save_checkpoint", "load_checkpoint", "read_checkpoint", "CheckpointError"]

FORMAT = "pyro-multihop-checkpoint"
_ZIP_MAGIC = b"PK\x03\x04"
VERSION = 1

_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


class CheckpointError(ValueError):
    """A file is not a readable pyro-multihop checkpoint, or does not fit the model it is loaded into; the
    message names the file and the entry or parameter."""


def _head_classes() -> dict:
    """:data:`pyro_multihop.models.registry.HEAD_CLASSES`, imported on first use (the heads import Pyro)."""
    try:
        from .models.registry import HEAD_CLASSES
    except ImportError as error:
        raise CheckpointError(f"the model classes are not available: {error}") from None
    return HEAD_CLASSES


def model_class(name: str) -> type:
    """The head class registered as ``name`` in :data:`pyro_multihop.models.registry.HEAD_CLASSES`."""
    classes = _head_classes()
    if name not in classes:
        raise CheckpointError(f"model_class must be one of {sorted(classes)}, got {name!r}")
    return classes[name]


def __getattr__(name: str):
    if name == "MODEL_CLASSES":  # deprecated: the registry of heads is pyro_multihop.models.registry
        warnings.warn("pyro_multihop.checkpoint.MODEL_CLASSES is deprecated; use "
                      "pyro_multihop.models.registry.HEAD_CLASSES (class name -> class)", DeprecationWarning, stacklevel=2)
        return {class_name: f"{cls.__module__}:{class_name}" for class_name, cls in _head_classes().items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dtype_name(model: torch.nn.Module) -> str:
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) > 1:
        raise CheckpointError(f"model parameters must share one dtype, got {sorted(str(d) for d in dtypes)}")
    dtype = dtypes.pop() if dtypes else torch.get_default_dtype()
    return str(dtype).replace("torch.", "")


def _registered_name(model) -> str:
    name = type(model).__name__
    if name not in _head_classes():
        raise CheckpointError(f"model must be one of {sorted(_head_classes())}, got {name}")
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
    vocabulary: Optional[Sequence[str]] = None,
) -> Path:
    """Write ``model`` (and ``optimizer``, ``step``, ``extra``) to ``path`` atomically.

    :param path: destination file; its folder must exist.
    :param model: a head registered in :data:`pyro_multihop.models.registry.HEAD_CLASSES`, with ``config()``.
    :param optimizer: optional optimiser whose ``state_dict()`` is stored.
    :param int step: optimisation steps taken so far.
    :param dict extra: more state; only tensors, numbers, strings, None, and lists/tuples/dicts of them
        survive ``torch.load(weights_only=True)``.
    :param vocabulary: optional text of each symbol, ``vocabulary[s]`` for symbol ``s``: distinct strings,
        returned by :func:`load_checkpoint` as ``state["vocabulary"]`` (to print words, not numbers).
    :returns: the path written.
    """
    path = Path(path)
    if vocabulary is not None:
        vocabulary = _checked_vocabulary(vocabulary, "vocabulary", TypeError)
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
        "vocabulary": vocabulary,
    }
    payload["sha256"] = _digest(payload)
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
        raise CheckpointError(f"checkpoint {str(path)!r}: dtype must be one of {sorted(_DTYPES)}, got {payload['dtype']!r}")
    for key, kinds, what in (
        ("config", dict, "a dictionary"),
        ("state_dict", dict, "a dictionary of tensors"),
        ("optimizer", (dict, type(None)), "a dictionary or None"),
        ("extra", (dict, type(None)), "a dictionary or None"),
        ("step", int, "a non-negative integer"),
    ):
        value = payload.get(key)
        if not isinstance(value, kinds) or isinstance(value, bool) or (key == "step" and value < 0):
            raise CheckpointError(f"checkpoint {str(path)!r}: entry {key!r} must be {what}, got {_shown(value)}")
    if payload.get("vocabulary") is not None:
        _checked_vocabulary(payload["vocabulary"], f"checkpoint {str(path)!r}: entry 'vocabulary'", CheckpointError)
    if "sha256" in payload and all(isinstance(v, torch.Tensor) for v in payload["state_dict"].values()):
        if payload["sha256"] != _digest(payload):
            raise CheckpointError(f"checkpoint {str(path)!r} is damaged: its parameters or configuration do not match "
                                  "the sha256 digest written with them")
    return payload


def _digest(payload: dict) -> str:
    """SHA-256 of what rebuilds the model: class, configuration, dtype, step, vocabulary and every tensor of the
    state dict (name, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    fields = [payload["model_class"], payload["config"], payload["dtype"], payload["step"], payload.get("vocabulary")]
    digest.update(json.dumps(fields, sort_keys=True, default=repr).encode())
    for name in sorted(payload["state_dict"], key=str):
        tensor = payload["state_dict"][name]
        digest.update(f"\0{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _shown(value) -> str:
    text = repr(value)
    return f"a {type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _checked_vocabulary(vocabulary, name: str, error: type) -> list:
    """``vocabulary`` as a list of distinct strings; ``error`` (naming ``name``) otherwise."""
    if isinstance(vocabulary, (str, bytes)) or not isinstance(vocabulary, (list, tuple)):
        raise error(f"{name} must be a list of strings (index = symbol), got {_shown(vocabulary)}")
    seen = {}
    for symbol, word in enumerate(vocabulary):
        if not isinstance(word, str):
            raise error(f"{name} must hold strings; symbol {symbol} is {_shown(word)}")
        if word in seen:
            raise CheckpointError(f"{name} must hold distinct strings; symbols {seen[word]} and {symbol} are both {word!r}")
        seen[word] = symbol
    return list(vocabulary)


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
            model = cls(**upgraded_config(cls, payload["config"]))
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"cannot rebuild {payload['model_class']} from {payload['config']}: {error}") from None
    model = model.to(_DTYPES[payload["dtype"]])
    load_parameters(model, payload)
    return model


def upgraded_config(cls, config: dict) -> dict:
    """``config`` as this release's constructor reads it: a head that gained an argument whose default differs from
    how its older checkpoints were trained says, in its ``config_from_checkpoint``, what they meant."""
    upgrade = getattr(cls, "config_from_checkpoint", None)
    return dict(config) if upgrade is None or not isinstance(config, dict) else dict(upgrade(dict(config)))


def upgraded_state_dict(cls, state_dict):
    """``state_dict`` as this release's head reads it: a head that gained a parameter whose value 0 gives the head
    its older checkpoints were trained as fills it in, in its ``state_from_checkpoint``."""
    upgrade = getattr(cls, "state_from_checkpoint", None)
    return state_dict if upgrade is None or not isinstance(state_dict, dict) else upgrade(dict(state_dict))


def load_parameters(model, payload: dict) -> None:
    """Copy the parameters of a checkpoint dictionary into ``model`` (same class and configuration)."""
    name = type(model).__name__
    if name != payload["model_class"]:
        raise CheckpointError(f"checkpoint holds a {payload['model_class']}, the model is a {name}")
    # A head whose parameters come in kinds (FactAttention: tables or symbol embeddings) says which the state
    # dict's names are and what to do, before the configurations are compared.
    mismatch = getattr(model, "checkpoint_mismatch", None)
    message = None if mismatch is None or not isinstance(payload["state_dict"], dict) else \
        mismatch(payload["config"], payload["state_dict"])
    if message is not None:
        raise CheckpointError(message)
    if dict(model.config()) != upgraded_config(type(model), payload["config"]):
        raise CheckpointError(f"checkpoint configuration {payload['config']} differs from the model's {model.config()}")
    state_dict = _checked_state_dict(model, upgraded_state_dict(type(model), payload["state_dict"]))
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as error:
        raise CheckpointError(f"checkpoint parameters do not fit the model: {str(error).splitlines()[0]}") from None


_OLD_SUFFIX = "_unconstrained"


def _checked_state_dict(model, state_dict) -> dict:
    """``state_dict`` if it holds exactly the model's parameters and buffers, each a finite tensor of the model's
    dtype and shape; a :class:`CheckpointError` naming the first one that is not."""
    if not isinstance(state_dict, dict):
        raise CheckpointError(f"entry 'state_dict' must be a dictionary of tensors, got {_shown(state_dict)}")
    expected = model.state_dict()
    for name in state_dict:
        if name in expected:
            continue
        if isinstance(name, str) and name.endswith(_OLD_SUFFIX) and name[: -len(_OLD_SUFFIX)] in expected:
            raise CheckpointError(
                f"parameter {name!r} has the name it had before parameters were renamed: this checkpoint is "
                f"older than this version; rename every entry NAME{_OLD_SUFFIX} of its 'state_dict' to NAME "
                "(torch.load, rename, torch.save) or train again"
            )
        raise CheckpointError(f"parameter {name!r} is not a parameter of {type(model).__name__}")
    for name, reference in expected.items():
        if name not in state_dict:
            raise CheckpointError(f"parameter {name!r} of {type(model).__name__} is missing")
        value = state_dict[name]
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"parameter {name!r} must be a tensor, got {_shown(value)}")
        if value.dtype != reference.dtype:
            raise CheckpointError(f"parameter {name!r} must have dtype {reference.dtype} like the model's, got {value.dtype}")
        if value.shape != reference.shape:
            raise CheckpointError(
                f"parameter {name!r} must have shape {tuple(reference.shape)}, got {tuple(value.shape)}"
            )
        if value.is_floating_point():
            bad = ~torch.isfinite(value)
            if bad.any():
                index = tuple(int(i) for i in bad.nonzero()[0])
                raise CheckpointError(f"parameter {name!r} must be finite, got {value[index].item()} at index {index}")
    return state_dict


def load_checkpoint(path: Union[str, os.PathLike]):
    """Read a checkpoint written by :func:`save_checkpoint`.

    :returns: ``(model, state)``: the rebuilt head (on the CPU, in the stored dtype) and a dict with
        ``step``, ``optimizer`` (a state dict or None), ``extra``, ``config``, ``model_class``, ``dtype``
        and ``vocabulary`` (a list of strings, or None when none was saved).
    :raises CheckpointError: (a ``ValueError``) naming the problem if the file is missing, not a
        checkpoint, or holds a model that cannot be rebuilt.
    """
    payload = read_checkpoint(path)
    try:
        model = build_model(payload)
    except CheckpointError as error:
        raise CheckpointError(f"checkpoint {str(Path(path))!r}: {error}") from None
    keys = ("step", "optimizer", "extra", "config", "model_class", "dtype", "vocabulary")
    state = {k: payload.get(k) for k in keys}
    state["extra"] = state["extra"] or {}
    return model, state
