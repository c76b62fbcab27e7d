"""Spawned gloo process groups for the distributed tests: a free localhost port, and one group run to the end
under a deadline (every process killed if it does not finish), each rank saving its results to a file."""

import socket
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_group(entry, folder, world: int, timeout: float) -> list:
    """Run ``entry(rank, port, folder)`` on ``world`` spawned processes; ``[rank 0's results, ...]``, read from
    ``folder/rank<r>.pt``. ``TimeoutError`` if the group has not finished in ``timeout`` seconds."""
    context = mp.start_processes(entry, args=(free_port(), str(folder)), nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the spawned process group did not finish in {timeout} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False) for r in range(world)]
