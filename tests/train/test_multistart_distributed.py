"""fit_svi(starts=K) under torch.distributed: 2 gloo processes, each holding its shard of the rows, split the
starts (start k on rank k mod 2, each fitted on every row), and every rank ends with the start one process keeps."""

import datetime
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from pyro_multihop import transitive_task
from pyro_multihop.train import fit_svi
from svi_test_heads import small_head
from process_group import run_group

WORLD, STARTS = 2, 3
RUN_TIMEOUT = 240  # seconds for the whole spawned session


def rows():
    return transitive_task(61, seed=0)


def fit_starts(head, obs, callback=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_svi(head, obs, num_steps=20, log_every=10, starts=STARTS, seed=0, processes=1, progress=False,
                       callback=callback)


def _starts_on_rank(rank, port, folder):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    try:
        obs = rows()
        mine = obs[:30] if rank == 0 else obs[30:]
        head = small_head()
        logged = []  # the rows this rank logged: 3 (steps 0, 10, 20) per start it fitted
        metrics = fit_starts(head, mine, callback=lambda step, model, row: logged.append(step))
        torch.save({"starts": metrics.attrs["starts"], "state": head.state_dict(), "logged": logged,
                    "loss": metrics["loss"].tolist()}, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("starts_distributed")
    return run_group(_starts_on_rank, folder, WORLD, RUN_TIMEOUT)


def test_ranks_split_the_starts_and_keep_the_start_one_process_keeps(ranks):
    single = small_head()
    expected = fit_starts(single, rows())
    for result in ranks:
        assert len(result["starts"]) == STARTS
        for got, want in zip(result["starts"], expected.attrs["starts"]):
            for key, value in want.items():
                assert got[key] == (pytest.approx(value, abs=1e-6) if isinstance(value, float) else value), key
        assert result["loss"] == pytest.approx(expected["loss"].tolist(), abs=1e-6)
        for name, value in single.state_dict().items():
            assert torch.allclose(result["state"][name], value, atol=1e-6), name
    assert torch.equal(ranks[0]["state"]["key_tables"], ranks[1]["state"]["key_tables"])
    assert ranks[0]["logged"] == [0, 10, 20] * 2 and ranks[1]["logged"] == [0, 10, 20]  # starts 0, 2 | start 1
