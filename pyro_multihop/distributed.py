"""Data parallelism over ``torch.distributed``: the few collectives that EM, variational EM and SVI need.

Every process (rank) of a process group holds one shard of the rows. What the estimators add up over rows is
summed over ranks with one flattened all-reduce, so that every rank then takes the same step:

- :class:`~pyro_multihop.em.ChainedEM`: the :class:`~pyro_multihop.em.SufficientStats` of each E-step
  (:func:`all_reduce_stats`), then the same M-step on every rank;
- :class:`~pyro_multihop.em.TiedEmbeddingVEM`: the ELBO gradient, the ELBO and the emission counts;
- :func:`~pyro_multihop.train.fit_svi`: the gradients of every step (:func:`all_reduce_gradients`) and the
  full-data loss that the divergence guard and the metrics read.

Without an initialised process group (or with one of a single process) every function here is the
identity, and the library behaves exactly as in one process. Launch with ``torchrun`` (gloo on CPUs, nccl
and one GPU per rank on GPUs; :func:`init_from_env`); nothing here launches, schedules or transports.

Example (two processes on one machine)::

    torchrun --standalone --nproc-per-node 2 -m pyro_multihop train --data train.csv --method em --out run
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import hashlib
import os
from typing import Iterable, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = [
    "is_distributed",
    "rank",
    "world_size",
    "shard_bounds",
    "rank_seed",
    "all_reduce_",
    "all_reduce_sum",
    "all_reduce_max",
    "all_reduce_stats",
    "all_reduce_gradients",
    "broadcast_module",
    "broadcast_object",
    "all_gather_objects",
    "evaluate",
    "agreed",
    "agreed_error",
    "PeerError",
    "init_from_env",
    "local_device",
    "barrier",
    "shutdown",
    "single_process",
]

#: Default timeout of the process group that :func:`init_from_env` starts (collectives fail after it).
DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)


class PeerError(RuntimeError):
    """Raised on every rank when a block run under :func:`agreed` failed on another rank."""


_single_process_depth = 0  # > 0 inside single_process(): this process acts alone


def is_distributed() -> bool:
    """True when a process group of more than one process is initialised (and not inside
    :func:`single_process`)."""
    return (_single_process_depth == 0 and dist.is_available() and dist.is_initialized()
            and dist.get_world_size() > 1)


@contextlib.contextmanager
def single_process():
    """Within the block this process acts as if it had no process group (rank 0 of 1): every function here
    is the identity, so a fit inside it runs on this rank's data alone. For work split across ranks by
    task rather than by rows, such as the starts of ``fit_svi(starts=K)``."""
    global _single_process_depth
    _single_process_depth += 1
    try:
        yield
    finally:
        _single_process_depth -= 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    """Number of processes (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def shard_bounds(n: int, shard_rank: int, shards: int) -> tuple:
    """``(start, stop)`` of shard ``shard_rank`` of ``shards`` contiguous, near-equal shards of ``n`` rows
    (sizes differ by at most one; a shard is empty when ``n < shards``)."""
    return n * shard_rank // shards, n * (shard_rank + 1) // shards


def rank_seed(seed: int, shard_rank: Optional[int] = None) -> int:
    """A seed for ``shard_rank``'s own random stream, derived from ``seed``; ``seed`` itself without a
    process group (so that one process draws what it always drew)."""
    if shard_rank is None:
        if not is_distributed():
            return int(seed)
        shard_rank = rank()
    digest = hashlib.sha256(f"pyro-multihop:{int(seed)}:{int(shard_rank)}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# -- collectives ------------------------------------------------------------------------------------------
def _communication_device(device: torch.device) -> torch.device:
    """nccl reduces CUDA tensors only; gloo reduces CPU tensors (and CUDA ones through host copies)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return device if device.type == "cpu" else torch.device("cpu")


def all_reduce_(tensors: Sequence[torch.Tensor], op=None) -> Sequence[torch.Tensor]:
    """Sum (or ``op``) ``tensors`` over ranks in place, in one flattened all-reduce of their widest dtype.

    Without a process group the tensors are returned unchanged.
    """
    if not is_distributed() or not tensors:
        return tensors
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    device = _communication_device(tensors[0].device)
    flat = torch.cat([t.detach().reshape(-1).to(device=device, dtype=dtype) for t in tensors])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM if op is None else op)
    offset = 0
    with torch.no_grad():
        for tensor in tensors:
            size = tensor.numel()
            tensor.copy_(flat[offset : offset + size].view(tensor.shape))
            offset += size
    return tensors


def all_reduce_sum(*values: float) -> tuple:
    """The sums over ranks of the Python numbers ``values`` (float64), as a tuple of floats."""
    if not is_distributed():
        return tuple(float(v) for v in values)
    buffer = torch.tensor([float(v) for v in values], dtype=torch.float64)
    all_reduce_([buffer])
    return tuple(buffer.tolist())


def all_reduce_max(value: int) -> int:
    """The largest ``value`` over ranks (an integer)."""
    if not is_distributed():
        return int(value)
    buffer = torch.tensor([int(value)], dtype=torch.int64)
    all_reduce_([buffer], op=dist.ReduceOp.MAX)
    return int(buffer)


def all_reduce_stats(stats):
    """EM :class:`~pyro_multihop.em.SufficientStats` summed over ranks: one all-reduce of
    ``L S^2 + L S + S T + 2`` numbers. Statistics of disjoint shards add, so every rank gets those of
    the union of the shards."""
    if not is_distributed():
        return stats
    scalars = torch.tensor([stats.loglik, stats.n], dtype=torch.float64, device=stats.key_numerators.device)
    tensors = [stats.key_numerators.clone(), stats.key_masses.clone(), stats.emission_counts.clone(), scalars]
    all_reduce_(tensors)
    loglik, n = scalars.tolist()
    return type(stats)(tensors[0], tensors[1], tensors[2], loglik, n)


def all_reduce_gradients(parameters: Iterable[torch.Tensor]) -> None:
    """Sum the ``.grad`` of ``parameters`` over ranks in one all-reduce (a missing gradient counts as 0)."""
    if not is_distributed():
        return
    parameters = [p for p in parameters if p.requires_grad]
    for parameter in parameters:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    all_reduce_([p.grad for p in parameters])


@torch.no_grad()
def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers into ``module`` on every rank."""
    if not is_distributed():
        return
    for tensor in list(module.parameters()) + list(module.buffers()):
        buffer = tensor.detach().to(_communication_device(tensor.device)).contiguous()
        dist.broadcast(buffer, src)
        tensor.copy_(buffer)


def broadcast_object(value, src: int = 0):
    """Rank ``src``'s picklable ``value``, on every rank."""
    if not is_distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src)
    return box[0]


def all_gather_objects(value) -> list:
    """``[value of rank 0, value of rank 1, ...]`` on every rank (picklable values)."""
    if not is_distributed():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def barrier() -> None:
    if is_distributed():
        dist.barrier()


@torch.no_grad()
def evaluate(model, obs) -> dict:
    """``model.evaluate`` over the union of every rank's ``obs`` (a rank may hold none):
    ``{"log_likelihood": mean, "accuracy": mean, "n": total}``."""
    if not is_distributed():
        return model.evaluate(obs)
    if len(obs):
        result = model.evaluate(obs)
        local = (result["log_likelihood"] * len(obs), result["accuracy"] * len(obs), len(obs))
    else:
        model.check_observations(obs)
        local = (0.0, 0.0, 0)
    log_likelihood, correct, n = all_reduce_sum(*local)
    if n == 0:
        raise ValueError("obs must hold at least one observation to evaluate, got 0 on every rank")
    return {"log_likelihood": log_likelihood / n, "accuracy": correct / n, "n": int(n)}


@contextlib.contextmanager
def agreed():
    """Run a block on every rank; if it raises on any rank, raise on every rank.

    The rank that failed re-raises its own exception; the others raise :class:`PeerError` naming the
    first failed rank and its message. Use it around validation before collectives, so that a bad shard
    ends every process at once instead of leaving the others waiting in a collective. Without a process
    group it is a plain block.
    """
    if not is_distributed():
        yield
        return
    error = None
    try:
        yield
    except Exception as caught:  # every rank must reach the collective below
        error = caught
    failures = all_gather_objects(None if error is None else f"{type(error).__name__}: {_first_line(error)}")
    failed = [(r, message) for r, message in enumerate(failures) if message is not None]
    if not failed:
        return
    if error is not None:
        error.pyro_multihop_agreed = True
        raise error
    first_rank, message = failed[0]
    peer = PeerError(f"rank {first_rank}: {message.split(': ', 1)[-1]}")
    peer.pyro_multihop_agreed = True
    raise peer


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


# -- launching ------------------------------------------------------------------------------------------
def init_from_env(backend: Optional[str] = None, timeout: datetime.timedelta = DEFAULT_TIMEOUT) -> bool:
    """Join the process group that ``torchrun`` describes in the environment (``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``).

    :param backend: ``"gloo"`` or ``"nccl"``; default nccl where CUDA is available, else gloo. With nccl
        this process uses the GPU ``cuda:LOCAL_RANK``.
    :param timeout: how long a collective may wait for the other ranks before it fails.
    :returns: True if a group was initialised here, False outside ``torchrun`` (no ``WORLD_SIZE``) or if
        one already exists.
    """
    if "WORLD_SIZE" not in os.environ or not dist.is_available() or dist.is_initialized():
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend=backend, timeout=timeout)
    return True


def local_device(device: torch.device) -> torch.device:
    """``device`` for this rank: a CUDA device without an index becomes ``cuda:LOCAL_RANK`` under torchrun."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    return device


def shutdown() -> None:
    """Destroy the process group if one is initialised (the end of a ``torchrun`` command)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def agreed_error(error: BaseException) -> bool:
    """Whether ``error`` was raised on every rank by :func:`agreed`."""
    return bool(getattr(error, "pyro_multihop_agreed", False))
