"""How a traced (``jit=True``) SVI loss sees a data object: :class:`JitFields`.

``JitTrace_ELBO`` and ``JitTraceEnum_ELBO`` trace a function of tensors; a data object is passed to it as the
tensors its constructor takes, and rebuilt from them inside the traced function.
"""

from __future__ import annotations

import inspect
from typing import Callable

import torch

__all__ = ["JitFields"]

_MISSING = object()


class JitFields:
    """How ``JitTraceEnum_ELBO`` sees a data object: its constructor's arguments, read from the attributes
    of the same names (tensors, or None for an absent optional one), passed positionally, and the object
    rebuilt from them inside the traced function. Any data class built that way works; one that is not
    raises ``TypeError`` (train it with ``jit=False``)."""

    def __init__(self, obs):
        self.data_type = type(obs)
        try:
            parameters = inspect.signature(self.data_type).parameters.values()
        except (TypeError, ValueError):
            parameters = ()
        names = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        for name in names:
            value = getattr(obs, name, _MISSING)
            if value is not None and not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"jit=True needs data whose constructor arguments are tensor attributes of the same names; "
                    f"{self.data_type.__name__}.{name} is {type(value).__name__ if value is not _MISSING else 'missing'} "
                    f"(train with jit=False)"
                )
        if not names:
            raise TypeError(f"jit=True cannot read the constructor arguments of {self.data_type.__name__} (train with jit=False)")
        self.names = tuple(names)

    def arguments(self, obs, kwargs: dict):
        """Split a call: tensors positionally (the data's fields, then the numeric ``svi_kwargs`` as 0-dim
        tensors so that a changing KL weight does not recompile), the rest as hashable keyword arguments."""
        present = tuple(name for name in self.names if getattr(obs, name) is not None)
        args = [getattr(obs, name) for name in present]
        static = {"_fields": present}
        tensor_names = []
        for name, value in sorted(kwargs.items()):
            if isinstance(value, (float, torch.Tensor)) and name != "subsample_size":
                args.append(torch.as_tensor(value, dtype=torch.get_default_dtype(), device=args[0].device))
                tensor_names.append(name)
            else:
                static[name] = value
        static["_tensor_kwargs"] = tuple(tensor_names)
        return args, static

    def wrap(self, fn: Callable) -> Callable:
        """``fn(obs, **kwargs)`` as a function of the split call :meth:`arguments` makes."""
        data_type = self.data_type

        def call(*args, _fields, _tensor_kwargs, **kwargs):
            obs = data_type(**dict(zip(_fields, args[: len(_fields)])))
            kwargs.update(zip(_tensor_kwargs, args[len(_fields) :]))
            return fn(obs, **kwargs)

        return call
