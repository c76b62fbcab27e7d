"""Data-parallel EM and SVI over torch.distributed: 2 gloo processes on localhost equal one process.

One spawned process group (2 ranks, a free port, a timeout on the group and on the whole run) runs every
scenario once (`_scenarios`); the tests compare what each rank returned with single-process runs on the
union of the shards, computed here. The command is tested under ``torchrun`` as a subprocess.
"""

import datetime
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pyro
import pytest
import torch
import torch.distributed as dist

from pyro_multihop import ChainedAttention, ChainedEM, Observations, TiedEmbeddingAttention, TiedEmbeddingVEM
from pyro_multihop import distributed
from pyro_multihop.train import fit_svi
from pyro_multihop.train.svi_loss import SviLoss as _Loss
from process_group import run_group

ROOT = Path(__file__).resolve().parent.parent
WORLD = 2
S = 8  # symbols = targets of the small transitive task
GROUP_TIMEOUT = datetime.timedelta(seconds=60)
RUN_TIMEOUT = 240  # seconds for the whole spawned session


# -- data and shard layouts --------------------------------------------------------------------------------
def data() -> Observations:
    from pyro_multihop import transitive_task

    return transitive_task(61, num_symbols=S, pairs=3, seed=0)


LAYOUTS = {"uneven": [(0, 30), (30, 61)], "empty_first": [(0, 0), (0, 61)]}


def shard(obs: Observations, layout: str, rank: int) -> Observations:
    start, stop = LAYOUTS[layout][rank]
    return obs[start:stop]


def chained_head(seed=1):
    return ChainedAttention(2, S, S, sigma2=0.1, seed=seed).double()


def tied_head(seed=1):
    return TiedEmbeddingAttention(S, 3, S, n_hops=2, sigma2=0.3, seed=seed).double()


def em() -> ChainedEM:
    return ChainedEM(2, S, S, sigma2=0.1)


def em_fit(obs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return em().fit(obs, max_iters=5, tol=0.0, **kwargs)


def svi(head, obs, **kwargs):
    options = dict(num_steps=20, lr=0.05, batch_size=10**6, log_every=5, seed=0, progress=False)
    options.update(kwargs)
    return fit_svi(head, obs, **options)


def tensors(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


# -- the spawned process group -----------------------------------------------------------------------------
def _entry(rank, port, folder):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=GROUP_TIMEOUT
    )
    try:
        results = _scenarios(rank, Path(folder))
        torch.save(results, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _scenarios(rank: int, folder: Path) -> dict:
    """Everything the tests check, run on each rank; a failing scenario records its error."""
    obs, results = data(), {}

    def run(name, compute):
        pyro.clear_param_store()
        try:
            results[name] = compute()
        except Exception as error:  # recorded, so that the other scenarios still run
            results[name] = {"error": f"{type(error).__name__}: {error}"}

    init = chained_head(seed=5)
    for layout in LAYOUTS:
        here = shard(obs, layout, rank)

        def em_from_init():
            result = em_fit(here, init=init)
            return {"loglik": result.loglik, "model": tensors(result.final_model)}

        def svi_chained():
            head = chained_head()
            metrics = svi(head, here)
            return {"model": tensors(head), "loss": metrics["loss"].tolist()}

        def svi_tied():
            head = tied_head()
            metrics = svi(head, here)
            return {"model": tensors(head), "loss": metrics["loss"].tolist()}

        def vem():
            fitted = TiedEmbeddingVEM(S, 3, S, 2, max_iters=6, anneal_iters=2, window=2, seed=0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fitted.fit(here)
            return {"means": fitted.means_, "emission": fitted.emission_, "bounds": fitted.lower_bounds_}

        def svi_collapsed(make_head):
            def compute():
                head = make_head()
                metrics = svi(head, here, collapsed=True)
                return {"model": tensors(head), "loss": metrics["loss"].tolist()}
            return compute

        run(f"em_init/{layout}", em_from_init)
        run(f"svi_collapsed_chained/{layout}", svi_collapsed(chained_head))
        run(f"svi_collapsed_tied/{layout}", svi_collapsed(tied_head))
        run(f"svi_chained/{layout}", svi_chained)
        run(f"svi_tied/{layout}", svi_tied)
        run(f"vem/{layout}", vem)

    here = shard(obs, "uneven", rank)

    def em_seeded():
        result = em_fit(here, seed=0, dtype=torch.float64)
        return {"loglik": result.loglik, "model": tensors(result.final_model)}

    def loss_shares():
        # 41 copies of one observation: every mini-batch share, scaled to the global n, sums to the exact loss.
        copies = obs[torch.zeros(41, dtype=torch.long)]
        mine = copies[:20] if rank == 0 else copies[20:]
        head = chained_head()
        with pyro.get_param_store().scope():
            minibatch = _Loss(head, mine, 4, False, total=41, largest_shard=21).train(0)
            estimate = _Loss.reduce(float(minibatch.detach()))
        # The tied head's full-data loss: its global KL term counts once over the shards.
        tied = tied_head()
        torch.manual_seed(11)
        with pyro.get_param_store().scope():
            tied_full = _Loss(tied, here, None, False, total=61, largest_shard=31).full(0)
        return {"minibatch": estimate, "tied_full": tied_full}

    def resume():
        val = data()[:20]
        val_here = val[:7] if rank == 0 else val[7:]
        settings = dict(num_steps=12, batch_size=8, log_every=4, seed=3, val=val_here, checkpoint_every=4)
        straight = tied_head(seed=0)
        expected = svi(straight, here, checkpoint=folder / "straight.pt", **settings)

        class Interrupt(Exception):
            pass

        def crash(step, model, row):
            if step == 8:
                raise Interrupt

        try:
            svi(tied_head(seed=0), here, checkpoint=folder / "resumed.pt", callback=crash, **settings)
        except Interrupt:
            pass
        resumed = tied_head(seed=0)
        with torch.no_grad():  # other values: everything must come from the checkpoint
            for parameter in resumed.parameters():
                parameter.add_(1.0)
        result = svi(resumed, here, checkpoint=folder / "resumed.pt", **settings)
        return {
            "straight": tensors(straight),
            "resumed": tensors(resumed),
            "expected": expected.drop(columns="seconds").to_dict("list"),
            "result": result.drop(columns="seconds").to_dict("list"),
            "resumed_from": result.attrs["resumed_from"],
        }

    def bad_shard():
        # Rank 1 holds a query symbol outside the model: every rank raises, none waits in a collective.
        bad = Observations(here.keys, here.values, here.query.clone(), here.target)
        if rank == 1:
            bad.query[3] = S + 2
        outcome = {}
        for name, call in (("svi", lambda: svi(chained_head(), bad, num_steps=2)), ("em", lambda: em_fit(bad))):
            try:
                call()
                outcome[name] = "no error"
            except Exception as error:
                outcome[name] = f"{type(error).__name__}: {error}"
        return outcome

    run("em_seeded", em_seeded)
    run("loss_shares", loss_shares)
    run("resume", resume)
    run("bad_shard", bad_shard)
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """``[results of rank 0, results of rank 1]`` of one spawned 2-process gloo group."""
    folder = tmp_path_factory.mktemp("distributed")
    return run_group(_entry, folder, WORLD, RUN_TIMEOUT), folder


def result(ranks, name, rank):
    value = ranks[0][rank][name]
    assert not (isinstance(value, dict) and "error" in value), value
    return value


def assert_close(actual: dict, expected: dict, tolerance: float):
    assert actual.keys() == expected.keys()
    for name in expected:
        difference = float((actual[name] - expected[name]).abs().max())
        assert difference <= tolerance, (name, difference)


# -- EM ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_em_from_init_equals_one_process(ranks, layout):
    expected = em_fit(data(), init=chained_head(seed=5))
    for rank in range(WORLD):
        got = result(ranks, f"em_init/{layout}", rank)
        assert got["loglik"] == pytest.approx(expected.loglik, rel=1e-12, abs=1e-10)
        assert_close(got["model"], tensors(expected.final_model), 1e-10)


def test_em_from_a_seed_gives_every_rank_the_model_of_the_summed_random_statistics(ranks):
    first, second = (result(ranks, "em_seeded", r) for r in range(WORLD))
    assert first["loglik"] == second["loglik"]
    for name in first["model"]:
        assert torch.equal(first["model"][name], second["model"][name]), name
    # The start is the M-step of every shard's random statistics (each shard its own seed), summed.
    obs = data()
    start = sum(
        em().random_stats(shard(obs, "uneven", r), seed=distributed.rank_seed(0, r), dtype=torch.float64)
        for r in range(WORLD)
    )
    expected = em_fit(obs, init=start)
    assert first["loglik"] == pytest.approx(expected.loglik, rel=1e-12)
    assert_close(first["model"], tensors(expected.final_model), 1e-10)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_variational_em_gives_every_rank_the_same_fit(ranks, layout):
    first, second = (result(ranks, f"vem/{layout}", r) for r in range(WORLD))
    for name in first:
        assert torch.equal(first[name], second[name]), name
    assert torch.isfinite(first["bounds"]).all() and len(first["bounds"]) == 6
    # The bounds are those of all 61 rows: of the order of 61 log-likelihoods, not of one shard's ~30.
    single = TiedEmbeddingVEM(S, 3, S, 2, max_iters=1, anneal_iters=2, window=2, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        single.fit(data())
    assert float(first["bounds"][0]) == pytest.approx(float(single.lower_bounds_[0]), rel=0.05)


# -- SVI -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("head", ["chained", "tied"])
def test_full_batch_svi_equals_one_process(ranks, head, layout):
    model = chained_head() if head == "chained" else tied_head()
    metrics = svi(model, data())
    for rank in range(WORLD):
        got = result(ranks, f"svi_{head}/{layout}", rank)
        assert_close(got["model"], tensors(model), 1e-8)
        assert got["loss"] == pytest.approx(metrics["loss"].tolist(), rel=1e-10, abs=1e-8)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("head", ["chained", "tied"])
def test_full_batch_collapsed_svi_equals_one_process(ranks, head, layout):
    model = chained_head() if head == "chained" else tied_head()
    metrics = svi(model, data(), collapsed=True)
    for rank in range(WORLD):
        got = result(ranks, f"svi_collapsed_{head}/{layout}", rank)
        assert_close(got["model"], tensors(model), 1e-8)
        assert got["loss"] == pytest.approx(metrics["loss"].tolist(), rel=1e-10, abs=1e-8)


def test_loss_shares_are_scaled_to_the_global_n(ranks):
    obs = data()
    copies = obs[torch.zeros(41, dtype=torch.long)]
    exact = float(-chained_head().log_likelihood(copies).mean().detach())
    tied = tied_head()
    torch.manual_seed(11)
    with pyro.get_param_store().scope():
        tied_full = _Loss(tied, obs, None, False).full(0)
    for rank in range(WORLD):
        got = result(ranks, "loss_shares", rank)
        assert got["minibatch"] == pytest.approx(exact, rel=1e-10)
        assert got["tied_full"] == pytest.approx(tied_full, rel=1e-10)


def test_interrupted_minibatch_run_resumes_bit_identically(ranks):
    folder = ranks[1]
    for rank in range(WORLD):
        got = result(ranks, "resume", rank)
        assert got["resumed_from"] == 8
        for name, value in got["straight"].items():
            assert torch.equal(value, got["resumed"][name]), name
        assert got["result"] == got["expected"]
    # Every rank ends with the same parameters; the checkpoint holds each rank's own random state.
    assert all(torch.equal(v, result(ranks, "resume", 1)["straight"][k]) for k, v in result(ranks, "resume", 0)["straight"].items())
    training = torch.load(folder / "straight.pt", weights_only=True)["extra"]["svi"]
    assert training["world_size"] == WORLD and len(training["rng"]) == WORLD
    assert not torch.equal(training["rng"][0]["torch"], training["rng"][1]["torch"])  # rank-distinct streams


def test_a_bad_shard_raises_on_every_rank(ranks):
    failed, peer = result(ranks, "bad_shard", 1), result(ranks, "bad_shard", 0)
    for method in ("svi", "em"):
        assert failed[method].startswith("ValueError: query must be < num_symbols"), failed[method]
        assert peer[method].startswith("PeerError: rank 1: query must be < num_symbols"), peer[method]


def test_without_a_group_the_helpers_are_the_identity():
    assert not distributed.is_distributed() and distributed.rank() == 0 and distributed.world_size() == 1
    stats = em().e_step(chained_head(), data())
    assert distributed.all_reduce_stats(stats) is stats
    assert distributed.all_reduce_sum(1.5, 2) == (1.5, 2.0)
    assert distributed.rank_seed(7) == 7
    assert distributed.shard_bounds(5, 1, 2) == (2, 5) and distributed.shard_bounds(1, 0, 2) == (0, 0)
    with pytest.raises(ValueError, match="plain"):
        with distributed.agreed():
            raise ValueError("plain")


# -- the command under torchrun ------------------------------------------------------------------------------
def torchrun(*arguments, timeout=180):
    """``torchrun --standalone --nproc-per-node 2 ARGUMENTS`` (a free port, no other process needed)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    return subprocess.run(command + list(arguments), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("torchrun")
    obs = data()
    obs.save(folder / "train.csv")
    obs[:21].save(folder / "val.parquet")
    return folder


def test_train_svi_under_torchrun_equals_one_process(files):
    from pyro_multihop.cli import main

    arguments = ["train", "--data", str(files / "train.csv"), "--val", str(files / "val.parquet"),
                 "--symbols", str(S), "--steps", "6", "--dtype", "float64", "--no-progress"]
    completed = torchrun("-m", "pyro_multihop", *arguments, "--out", str(files / "svi2"))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count("chained/svi:") == 1  # rank 0 alone prints
    assert main(arguments + ["--out", str(files / "svi1")]) == 0
    two = pd.read_json(files / "svi2" / "summary.json", typ="series")
    one = pd.read_json(files / "svi1" / "summary.json", typ="series")
    assert two["processes"] == 2 and one["processes"] == 1
    for split in ("train", "val"):
        assert two[split]["n"] == one[split]["n"]
        assert two[split]["log_likelihood"] == pytest.approx(one[split]["log_likelihood"], rel=1e-9)
    pd.testing.assert_frame_equal(
        pd.read_csv(files / "svi2" / "metrics.csv").drop(columns="seconds"),
        pd.read_csv(files / "svi1" / "metrics.csv").drop(columns="seconds"),
        rtol=1e-9,
    )


def test_console_script_trains_em_under_torchrun(files):
    script = shutil.which("pyro-multihop", path=str(Path(sys.executable).parent))
    assert script is not None
    completed = torchrun(script, "train", "--data", str(files / "train.csv"), "--method", "em", "--steps", "3",
                         "--symbols", str(S), "--out", str(files / "em2"))
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count("chained/em:") == 1
    summary = pd.read_json(files / "em2" / "summary.json", typ="series")
    assert summary["train"]["n"] == 61 and (files / "em2" / "checkpoint.pt").is_file()


def test_a_bad_row_in_one_shard_ends_every_rank_with_one_error_line(files):
    frame = pd.read_csv(files / "train.csv")
    frame.loc[50, "value_2"] = -4  # row 50 lies in rank 1's shard
    frame.to_csv(files / "bad.csv", index=False)
    completed = torchrun("-m", "pyro_multihop", "train", "--data", str(files / "bad.csv"), "--out", str(files / "bad"))
    errors = [line for line in completed.stderr.splitlines() if line.startswith("pyro-multihop train: error:")]
    assert errors == ["pyro-multihop train: error: rank 1: data file "
                      f"{str(files / 'bad.csv')!r}: data column 'value_2' row 50: expected a non-negative integer "
                      "symbol, got -4 (line 52 of the file)"]  # the row and line of the file, not of the shard
    assert completed.returncode != 0  # torchrun reports its workers' failure (exit status 1)
    assert "exitcode  : 2" in completed.stderr  # the workers end with the command's status 2
    assert "pyro_multihop/" not in completed.stderr  # no traceback from the library, only torchrun's report
    assert not (files / "bad").exists()
