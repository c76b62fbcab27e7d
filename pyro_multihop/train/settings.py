"""The settings of an SVI run and the optimiser they configure.

Settings come, in this order, from the keyword arguments of :func:`~pyro_multihop.fit_svi`, from the head's
``svi_defaults()`` (if it has one) and from :data:`SVI_DEFAULTS`; :func:`svi_settings` merges and checks
them. :func:`make_optimizer` builds the run's :class:`pyro.optim.clipped_adam.ClippedAdam` from them, a torch
optimiser with element-wise gradient clipping and a per-step learning-rate decay, with one parameter group
per weight decay.
"""

from __future__ import annotations

import math
from collections import defaultdict

from pyro.optim.clipped_adam import ClippedAdam

__all__ = ["SVI_DEFAULTS", "make_optimizer", "svi_settings"]

#: Library-wide SVI settings; a head's ``svi_defaults()`` overrides them, ``fit_svi``'s arguments override both.
SVI_DEFAULTS = {
    "num_steps": 1000,
    "lr": 0.05,
    "lr_decay": 1.0,
    "batch_size": None,
    "clip_norm": 10.0,
    "betas": (0.9, 0.999),
    "weight_decay": 0.0,
    "log_every": 10,
    "divergence_threshold": 0.25,
    "divergence_lr_factor": 0.5,
    "divergence_warmup": 40,
    "init_scale": 0.1,
}


def _head_defaults(model) -> dict:
    method = getattr(model, "svi_defaults", None)
    return dict(method() or {}) if method is not None else {}


def svi_settings(model, **overrides) -> dict:
    """The settings :func:`~pyro_multihop.fit_svi` would use for ``model``: ``SVI_DEFAULTS``, then
    ``model.svi_defaults()``, then the ``overrides`` that are not None. Raises ``ValueError`` naming an unknown
    or invalid setting."""
    settings = dict(SVI_DEFAULTS)
    head_defaults = _head_defaults(model)
    for source, values in (("svi_defaults()", head_defaults), ("fit_svi", overrides)):
        unknown = sorted(set(values) - set(SVI_DEFAULTS))
        if unknown:
            raise ValueError(f"{source} has unknown SVI settings {unknown}; known are {sorted(SVI_DEFAULTS)}")
    settings.update(head_defaults)
    settings.update({k: v for k, v in overrides.items() if v is not None})
    _check_settings(settings)
    return settings


def _check_settings(s: dict) -> None:
    for name in ("num_steps", "log_every"):
        value = s[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    warmup = s["divergence_warmup"]
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"divergence_warmup must be a non-negative integer, got {warmup!r}")
    if not (_positive_finite(s["init_scale"]) or s["init_scale"] == 0):
        raise ValueError(f"init_scale must be a non-negative finite number, got {s['init_scale']!r}")
    if s["batch_size"] is not None and (
        isinstance(s["batch_size"], bool) or not isinstance(s["batch_size"], int) or s["batch_size"] < 1
    ):
        raise ValueError(f"batch_size must be a positive integer or None, got {s['batch_size']!r}")
    for name in ("lr", "clip_norm"):
        if not _positive_finite(s[name]):
            raise ValueError(f"{name} must be a positive finite number, got {s[name]!r}")
    for name in ("lr_decay", "divergence_lr_factor"):
        if not _positive_finite(s[name]) or s[name] > 1:
            raise ValueError(f"{name} must be in (0, 1], got {s[name]!r}")
    threshold = s["divergence_threshold"]
    if threshold is not None and not (_positive_finite(threshold) or threshold == math.inf):
        raise ValueError(f"divergence_threshold must be a positive number (math.inf: no guard), got {threshold!r}")
    betas = s["betas"]
    if len(tuple(betas)) != 2 or not all(0 <= b < 1 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    decay = s["weight_decay"]
    values = decay.values() if isinstance(decay, dict) else [decay]
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"weight_decay must be a non-negative number or a dict of them, got {decay!r}")


def _positive_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


# -- the optimiser ---------------------------------------------------------------------------------------
def _parameter_groups(model, weight_decay) -> list:
    named = list(model.named_parameters())
    if not named:
        raise ValueError(f"model {type(model).__name__} has no parameters to fit")
    if not isinstance(weight_decay, dict):
        return [{"params": [p for _, p in named], "weight_decay": float(weight_decay)}]
    short = {name[: -len("_unconstrained")] if name.endswith("_unconstrained") else name: name for name, _ in named}
    unknown = sorted(k for k in weight_decay if k not in short and k not in short.values())
    if unknown:
        raise ValueError(f"weight_decay names unknown parameters {unknown}; the model has {sorted(short)}")
    decay_of = {short.get(k, k): float(v) for k, v in weight_decay.items()}
    groups = defaultdict(list)
    for name, parameter in named:
        groups[decay_of.get(name, 0.0)].append(parameter)
    return [{"params": params, "weight_decay": decay} for decay, params in groups.items()]


def make_optimizer(model, settings: dict) -> ClippedAdam:
    """ClippedAdam over ``model``'s parameters, configured by ``settings`` (as :func:`svi_settings` returns
    them): ``lr_decay`` spread over ``num_steps`` steps, one parameter group per ``weight_decay`` value."""
    return ClippedAdam(
        _parameter_groups(model, settings["weight_decay"]),
        lr=settings["lr"],
        betas=tuple(settings["betas"]),
        clip_norm=settings["clip_norm"],
        lrd=settings["lr_decay"] ** (1.0 / settings["num_steps"]),
    )
