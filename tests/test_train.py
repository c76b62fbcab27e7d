"""fit_svi: metrics, settings, seeding, mini-batch scaling, the divergence guard, resuming, jit, the
learning defaults on the transitive task, and the stability benchmark at smoke size."""

import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyro
import pytest
import torch

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.train import SVI_DEFAULTS, TrainingInterrupted, _Loss, fit_svi, svi_settings

ROOT = Path(__file__).resolve().parent.parent


def small_head(seed=0, **kwargs):
    return ChainedAttention(2, 30, 30, sigma2=0.1, seed=seed, **kwargs)


def exact_loss(head, obs) -> float:
    with torch.no_grad():
        return float(-head.log_likelihood(obs).mean())


def test_metrics_rows_columns_and_attrs():
    obs, val = transitive_task(120, seed=0), transitive_task(60, seed=1)
    head = small_head()
    initial = exact_loss(head, obs)
    metrics = fit_svi(head, obs, num_steps=25, log_every=10, val=val, progress=False)
    assert list(metrics.columns) == ["step", "loss", "lr", "val_log_likelihood", "val_accuracy", "seconds"]
    assert metrics["step"].tolist() == [0, 10, 20, 25]
    assert metrics["loss"].iloc[0] == pytest.approx(initial, rel=1e-5)  # full-batch loss = exact NLL per observation
    assert metrics["loss"].iloc[-1] == pytest.approx(exact_loss(head, obs), rel=1e-5)
    assert metrics["loss"].iloc[-1] < metrics["loss"].iloc[0]
    assert metrics["seconds"].is_monotonic_increasing
    assert metrics["lr"].iloc[0] == pytest.approx(metrics.attrs["settings"]["lr"])
    assert metrics["lr"].is_monotonic_decreasing
    attrs = metrics.attrs
    assert attrs["divergences"] == [] and attrs["resumed_from"] is None
    assert attrs["best_loss"] <= metrics["loss"].min() + 1e-12
    assert attrs["final_loss"] == pytest.approx(metrics["loss"].iloc[-1])


def test_settings_merge_head_defaults_and_arguments():
    head = small_head()
    settings = svi_settings(head, lr=0.01)
    assert settings["lr"] == 0.01
    assert set(settings) == set(SVI_DEFAULTS)
    assert settings["weight_decay"] == {"key_tables": pytest.approx(3e-3)}  # the chained head's measured default


def test_weight_decay_names_are_the_parameter_names():
    """Unconstrained parameters by their plain names; a constrained one (the tied guide's scale) by its name
    with or without Pyro's ``_unconstrained`` suffix; each group gets its own decay."""
    from pyro_multihop import TiedEmbeddingAttention
    from pyro_multihop.train import _parameter_groups

    head = small_head()
    assert [name for name, _ in head.named_parameters()] == ["key_tables", "emission_logits"]
    groups = _parameter_groups(head, {"key_tables": 3e-3})
    decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert decay_of == {id(head.key_tables): 3e-3, id(head.emission_logits): 0.0}
    tied = TiedEmbeddingAttention(6, 2, 6, seed=0)
    for name in ("guide.scale", "guide.scale_unconstrained"):
        groups = _parameter_groups(tied, {name: 1e-2, "guide.loc": 1e-3})
        decay_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
        assert decay_of == {id(tied.guide.loc): 1e-3, id(tied.guide.scale_unconstrained): 1e-2,
                            id(tied.emission_logits): 0.0}
    with pytest.raises(ValueError, match=r"key_tables_unconstrained.*\['emission_logits', 'key_tables'\]"):
        _parameter_groups(head, {"key_tables_unconstrained": 1e-3})


class _Fussy(ChainedAttention):
    def svi_defaults(self):
        return {"num_steps": 3, "bogus": 1}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_steps": 0}, "num_steps"),
        ({"lr": -1.0}, "lr"),
        ({"batch_size": 0}, "batch_size"),
        ({"lr_decay": 2.0}, "lr_decay"),
        ({"weight_decay": {"no_such_parameter": 1e-3}}, "no_such_parameter"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"checkpoint_every": 0}, "checkpoint_every"),
    ],
    ids=lambda value: str(value) if isinstance(value, str) else "-".join(value),
)
def test_invalid_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_svi(small_head(), transitive_task(20, seed=0), progress=False, **kwargs)


def test_unknown_head_default_is_named():
    fussy = _Fussy(2, 30, 30, seed=0)
    with pytest.raises(ValueError, match="bogus"):
        fit_svi(fussy, transitive_task(20, seed=0), progress=False)


def test_empty_data_raises():
    empty = transitive_task(10, seed=0)[torch.zeros(0, dtype=torch.long)]
    assert len(empty) == 0
    with pytest.raises(ValueError, match="at least one observation"):
        fit_svi(small_head(), empty, progress=False)
    with pytest.raises(ValueError, match="val"):
        fit_svi(small_head(), transitive_task(10, seed=0), val=empty, progress=False)


def test_bad_types_raise():
    with pytest.raises(TypeError, match="Observations"):
        fit_svi(small_head(), [1, 2, 3], progress=False)
    with pytest.raises(TypeError, match="model"):
        fit_svi(object(), transitive_task(10, seed=0), progress=False)
    with pytest.raises(ValueError, match="num_symbols"):
        fit_svi(ChainedAttention(2, 5, 30), transitive_task(10, seed=0), progress=False)


def test_seeded_run_is_reproducible_and_leaves_global_rng_alone():
    obs = transitive_task(80, seed=0)
    state = torch.get_rng_state()
    heads = [small_head(seed=0) for _ in range(3)]
    for head, seed in zip(heads, (5, 5, 6)):
        fit_svi(head, obs, num_steps=15, batch_size=16, seed=seed, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(heads[0].key_tables, heads[1].key_tables)
    assert not torch.equal(heads[0].key_tables, heads[2].key_tables)  # other mini-batches


def test_minibatch_loss_is_scaled_to_the_full_data():
    # 40 copies of one observation: every mini-batch has the full-data loss per observation exactly.
    one = transitive_task(1, seed=3)
    copies = one[torch.zeros(40, dtype=torch.long)]
    head = small_head()
    before = exact_loss(head, copies)
    seen = []

    class Spy(ChainedAttention):
        def model(self, obs, subsample_size=None):
            seen.append(subsample_size)
            return super().model(obs, subsample_size=subsample_size)

    spy = Spy(2, 30, 30, seed=0)
    metrics = fit_svi(spy, copies, num_steps=1, batch_size=8, progress=False)
    assert 8 in seen
    assert metrics["loss"].iloc[0] == pytest.approx(before, rel=1e-6)
    with pyro.get_param_store().scope():
        estimate = float(_Loss(head, copies, 8, jit=False).train(0).detach())
    assert estimate == pytest.approx(before, rel=1e-6)


def test_divergence_guard_restores_best_and_lowers_lr(caplog):
    obs = transitive_task(100, seed=0)
    head = small_head()

    def sabotage(step, model, row):
        if step == 20:
            with torch.no_grad():
                model.emission_logits.mul_(-3.0)  # the emission now avoids the right targets

    with caplog.at_level(logging.WARNING, logger="pyro_multihop.train"):
        metrics = fit_svi(head, obs, num_steps=40, log_every=10, callback=sabotage, progress=False)
    events = metrics.attrs["divergences"]
    assert [e["step"] for e in events] == [21]
    assert events[0]["best_step"] == 20 and events[0]["loss"] > events[0]["best_loss"] + 0.25
    assert events[0]["lr"] == pytest.approx(metrics["lr"].iloc[2] * 0.5 * (0.1 ** (1 / 40)), rel=1e-6)
    assert "divergence at step 21" in caplog.text
    assert metrics["loss"].iloc[-1] <= events[0]["best_loss"]  # recovered from the restored parameters


def test_best_parameters_restored_at_the_end():
    obs = transitive_task(100, seed=0)
    head = small_head()

    def sabotage(step, model, row):
        if step == 20:
            with torch.no_grad():
                model.emission_logits.mul_(-3.0)

    metrics = fit_svi(head, obs, num_steps=30, log_every=10, callback=sabotage, divergence_threshold=math.inf, progress=False)
    attrs = metrics.attrs
    assert attrs["divergences"] == [] and attrs["restored_best"]
    assert attrs["best_step"] == 20 and attrs["final_loss"] > attrs["best_loss"]
    assert exact_loss(head, obs) == pytest.approx(attrs["best_loss"], rel=1e-5)


def test_callback_can_stop_early():
    metrics = fit_svi(small_head(), transitive_task(50, seed=0), num_steps=100, log_every=5,
                      callback=lambda step, model, row: step >= 10, progress=False)
    assert metrics["step"].tolist() == [0, 5, 10, 11]


class _Interrupt(Exception):
    pass


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    obs, val = transitive_task(90, seed=0), transitive_task(30, seed=1)
    settings = dict(num_steps=30, batch_size=16, log_every=5, val=val, seed=3, progress=False, checkpoint_every=10)

    straight = small_head(seed=0)
    expected = fit_svi(straight, obs, checkpoint=tmp_path / "straight.pt", **settings)

    def crash(step, model, row):
        if step == 25:
            raise _Interrupt

    interrupted = small_head(seed=0)
    with pytest.raises(_Interrupt):
        fit_svi(interrupted, obs, checkpoint=tmp_path / "resumed.pt", callback=crash, **settings)
    resumed = small_head(seed=7)  # other initial values: everything must come from the checkpoint
    result = fit_svi(resumed, obs, checkpoint=tmp_path / "resumed.pt", **settings)

    assert result.attrs["resumed_from"] == 20
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    columns = ["step", "loss", "lr", "val_log_likelihood", "val_accuracy"]
    pd.testing.assert_frame_equal(result[columns], expected[columns])
    # A finished checkpoint is returned as is.
    again = fit_svi(small_head(seed=9), obs, checkpoint=tmp_path / "resumed.pt", **settings)
    pd.testing.assert_frame_equal(again[columns], expected[columns])


def test_jit_matches_the_interpreted_loss():
    obs = transitive_task(60, seed=0)
    plain, traced = small_head(seed=0), small_head(seed=0)
    a = fit_svi(plain, obs, num_steps=6, log_every=3, progress=False)
    b = fit_svi(traced, obs, num_steps=6, log_every=3, progress=False, jit=True)
    assert torch.allclose(plain.key_tables, traced.key_tables, atol=1e-5)
    assert a["loss"].tolist() == pytest.approx(b["loss"].tolist(), rel=1e-5)


def test_progress_bar_goes_to_stderr(capsys):
    fit_svi(small_head(), transitive_task(20, seed=0), num_steps=3, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and "svi" in captured.err


def test_tied_head_with_kl_annealing():
    tied = pytest.importorskip("pyro_multihop.models.tied")
    obs = transitive_task(60, num_symbols=12, pairs=3, seed=0)
    head = tied.TiedEmbeddingAttention(12, 4, 12, seed=0)
    metrics = fit_svi(head, obs, num_steps=12, batch_size=30, log_every=4, val=obs, progress=False)
    assert metrics["step"].tolist() == [0, 4, 8, 12]
    assert all(math.isfinite(v) for v in metrics["loss"])
    assert metrics.attrs["divergences"] == []


def test_defaults_reach_the_generating_structure():
    """The learning test: the library's defaults, untouched, from the default initialisation, on the
    transitive task at full size (2000 observations, one seed); measured on 3 seeds and against plain Adam
    by ``benchmarks/svi_stability.py``."""
    train = transitive_task(2000, seed=0)
    test = transitive_task(20000, seed=12345)
    eye = torch.eye(30)
    truth = ChainedAttention(2, 30, 30, 0.1, key_tables=eye.expand(2, 30, 30), emission=eye)
    head = small_head(seed=0)
    metrics = fit_svi(head, train, progress=False)
    attrs = metrics.attrs
    assert attrs["divergences"] == []
    assert attrs["final_loss"] <= 1.01 * attrs["best_loss"]
    assert attrs["final_loss"] < -truth.evaluate(train)["log_likelihood"]  # fits the training data at least as well
    assert head.evaluate(test)["accuracy"] >= truth.evaluate(test)["accuracy"] - 0.01


def test_stability_benchmark_smoke(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "svi_stability.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    table = pd.read_csv(tmp_path / "svi_stability.csv")
    assert set(table["run"]) == {"defaults", "plain-adam"}
    assert {"heldout_accuracy", "generating_heldout_accuracy", "last_loss", "best_loss"} <= set(table.columns)
    traces = pd.read_csv(tmp_path / "svi_stability_traces.csv")
    assert {"grad_norm_hop1", "table_norm_hop2", "adam_step_over_lr_median"} <= set(traces.columns)
    assert "| run | init |" in (tmp_path / "svi_stability.md").read_text()


def _send_at(signum, at_step):
    def callback(step, model, row):
        if step == at_step:
            os.kill(os.getpid(), signum)

    return callback


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_last_completed_step_and_restores_the_handlers(tmp_path, signum):
    obs = transitive_task(60, seed=0)
    path = tmp_path / "checkpoint.pt"
    before = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as caught:
        fit_svi(small_head(), obs, num_steps=30, log_every=10, progress=False, checkpoint=path,
                checkpoint_every=1000, callback=_send_at(signum, 10))
    assert (caught.value.step, caught.value.signum, caught.value.exit_status) == (11, signum, 128 + signum)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert load_checkpoint(path)[1]["step"] == 11
    assert signal.getsignal(signum) is before
    # Resumed, the run ends where an uninterrupted one does.
    resumed, reference = small_head(), small_head()
    metrics = fit_svi(resumed, obs, num_steps=30, log_every=10, progress=False, checkpoint=path)
    assert metrics.attrs["resumed_from"] == 11
    fit_svi(reference, obs, num_steps=30, log_every=10, progress=False)
    for name, value in reference.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name


def test_a_signal_after_the_last_step_finishes_the_run_then_reports_it(tmp_path):
    path = tmp_path / "checkpoint.pt"
    with pytest.raises(TrainingInterrupted) as caught:
        fit_svi(small_head(), transitive_task(60, seed=0), num_steps=20, log_every=10, progress=False,
                checkpoint=path, callback=_send_at(signal.SIGTERM, 20))  # the final row is logged at step 20
    assert caught.value.step == 20
    assert load_checkpoint(path)[1]["extra"]["svi"]["finished"]


def test_without_a_checkpoint_ctrl_c_interrupts_at_once():
    with pytest.raises(KeyboardInterrupt) as caught:
        fit_svi(small_head(), transitive_task(60, seed=0), num_steps=30, log_every=10, progress=False,
                callback=_send_at(signal.SIGINT, 10))
    assert not isinstance(caught.value, TrainingInterrupted)


# -- any data type, length groups, held-out data (issues 17 and 19) ---------------------------------------
class Points:
    """A data type that is not Observations: scalar points, built from its one tensor attribute."""

    def __init__(self, x):
        self.x = torch.as_tensor(x)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return Points(self.x[index])

    def to(self, device):
        return Points(self.x.to(device))


class GaussianMean(pyro.nn.PyroModule):
    """A toy head on Points: x ~ Normal(mu, 1), mu a parameter; the head API fit_svi relies on."""

    def __init__(self):
        super().__init__()
        self.mu = torch.nn.Parameter(torch.zeros(()))

    def check_observations(self, obs, name="obs"):
        if not isinstance(obs, Points):
            raise TypeError(f"{name} must be Points, got {type(obs).__name__}")
        return obs

    @pyro.nn.pyro_method
    def model(self, obs, subsample_size=None):
        with pyro.plate("obs", len(obs), subsample_size=subsample_size, dim=-1) as rows:
            pyro.sample("x", pyro.distributions.Normal(self.mu, 1.0), obs=obs.x[rows])

    @pyro.nn.pyro_method
    def guide(self, obs, subsample_size=None):
        pass

    def svi_kwargs(self, step):
        return {}

    def evaluate(self, obs):
        with torch.no_grad():
            log_likelihood = pyro.distributions.Normal(self.mu, 1.0).log_prob(obs.x).mean()
        return {"log_likelihood": float(log_likelihood), "accuracy": math.nan, "n": len(obs)}


@pytest.mark.parametrize("jit", [False, True], ids=["interpreted", "jit"])
def test_any_data_type_the_head_accepts_is_fitted(jit):
    points = Points(3.0 + torch.randn(200, generator=torch.Generator().manual_seed(0)))
    head = GaussianMean()
    metrics = fit_svi(head, points, num_steps=150, lr=0.1, log_every=50, jit=jit, progress=False)
    assert float(head.mu.detach()) == pytest.approx(float(points.x.mean()), abs=0.05)
    assert metrics["loss"].iloc[-1] < metrics["loss"].iloc[0]
    with pytest.raises(TypeError, match="obs must be Points"):
        fit_svi(GaussianMean(), transitive_task(5, seed=0), num_steps=1, progress=False)


def test_jit_names_a_data_type_it_cannot_rebuild():
    class Opaque(Points):
        def __init__(self, values):  # the constructor argument is not an attribute of that name
            super().__init__(values)

        def __getitem__(self, index):
            return Opaque(self.x[index])

        def to(self, device):
            return Opaque(self.x.to(device))

    with pytest.raises(TypeError, match="Opaque.values"):
        fit_svi(GaussianMean(), Opaque(torch.randn(10)), num_steps=1, jit=True, progress=False)


def padded_task(n=60, seed=0):
    """The transitive task with 10 extra positions: distractors on half of the rows, padding on the others."""
    from pyro_multihop import Observations

    base = transitive_task(n, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    extra = torch.randint(0, 30, (n, 10), generator=generator)
    mask = torch.ones(n, 20, dtype=torch.bool)
    mask[: n // 2, 10:] = False
    return Observations(torch.cat([base.keys, extra], 1), torch.cat([base.values, extra.flip(1)], 1), base.query,
                        base.target, mask)


@pytest.mark.parametrize("collapsed", [False, True], ids=["enumerated", "collapsed"])
def test_length_groups_are_exact(collapsed):
    obs = padded_task()
    assert obs.context_lengths().tolist() == [10] * 30 + [20] * 30
    plain, grouped = small_head(seed=0), small_head(seed=0)
    a = fit_svi(plain, obs, num_steps=8, log_every=4, collapsed=collapsed, progress=False)
    b = fit_svi(grouped, obs, num_steps=8, log_every=4, collapsed=collapsed, group_lengths=5, progress=False)
    assert b["loss"].tolist() == pytest.approx(a["loss"].tolist(), rel=1e-5)
    assert torch.allclose(plain.key_tables, grouped.key_tables, atol=2e-4)  # float32 Adam steps


def test_length_groups_scale_a_mini_batch_to_the_whole_data():
    obs = padded_task()
    head = small_head()
    exact = float(_Loss(head, obs, None, jit=False).full(0))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        estimates = [float(_Loss(head, obs, 12, jit=False, group_lengths=10).train(0).detach()) for _ in range(300)]
    assert sum(estimates) / len(estimates) == pytest.approx(exact, rel=0.03)
    assert float(_Loss(head, obs, None, jit=False, group_lengths=10).full(0)) == pytest.approx(exact, rel=1e-6)


def test_length_groups_need_data_that_can_be_cut():
    with pytest.raises(TypeError, match="context_lengths"):
        fit_svi(GaussianMean(), Points(torch.randn(10)), num_steps=1, group_lengths=5, progress=False)
    with pytest.raises(ValueError, match="jit"):
        fit_svi(small_head(), padded_task(), num_steps=1, group_lengths=5, jit=True, progress=False)


def shuffled_targets(obs, seed=1):
    """The same contexts with targets permuted: the better a head fits ``obs``, the worse it does here."""
    from pyro_multihop import Observations

    order = torch.randperm(len(obs), generator=torch.Generator().manual_seed(seed))
    return Observations(obs.keys, obs.values, obs.query, obs.target[order], obs.mask)


def test_best_checkpoint_patience_and_the_overfitting_warning(tmp_path):
    from pyro_multihop.train import OverfittingWarning

    obs = transitive_task(80, seed=0)
    head = small_head()
    states = {}

    def record(step, model, row):
        states[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    with pytest.warns(OverfittingWarning, match="held-out log-likelihood fell"):
        metrics = fit_svi(head, obs, val=shuffled_targets(obs), num_steps=200, log_every=5, patience=3,
                          checkpoint=tmp_path / "checkpoint.pt", callback=record, progress=False)
    best = metrics.attrs["best_val"]
    values = metrics.set_index("step")["val_log_likelihood"]
    assert best["step"] == values.idxmax() and best["log_likelihood"] == values.max()
    assert best["stopped_early"] and best["checkpoint"] == str(tmp_path / "best.pt")
    # Three evaluations without a better one, then the stop (and the final row one step later).
    assert metrics["step"].tolist()[-4:] == [best["step"] + 5, best["step"] + 10, best["step"] + 15, best["step"] + 16]
    saved, state = load_checkpoint(tmp_path / "best.pt")
    assert state["step"] == best["step"]
    assert state["extra"]["svi_best"]["chosen_by"] == "highest held-out log-likelihood"
    for name, value in states[best["step"]].items():
        assert torch.equal(saved.state_dict()[name], value), name


def test_a_good_fit_keeps_its_last_step_as_best_and_stays_silent(recwarn):
    obs, val = transitive_task(200, seed=0), transitive_task(100, seed=1)
    metrics = fit_svi(small_head(), obs, val=val, num_steps=30, log_every=10, progress=False)
    assert metrics.attrs["best_val"]["step"] == 30 and not metrics.attrs["best_val"]["stopped_early"]
    assert not [w for w in recwarn if "held-out" in str(w.message)]


def test_val_fraction_splits_by_the_seed():
    from pyro_multihop.train import split_validation

    obs = transitive_task(50, seed=0)
    train, held_out = split_validation(obs, 0.2, seed=4)
    again = split_validation(obs, 0.2, seed=4)[1]
    other = split_validation(obs, 0.2, seed=5)[1]
    assert len(train) == 40 and len(held_out) == 10 and held_out == again and not held_out == other
    rows = {tuple(r) for r in torch.cat([obs.keys, obs.target[:, None]], 1).tolist()}
    parts = [tuple(r) for part in (train, held_out) for r in torch.cat([part.keys, part.target[:, None]], 1).tolist()]
    assert sorted(parts) == sorted(tuple(r) for r in torch.cat([obs.keys, obs.target[:, None]], 1).tolist())
    assert len(rows) == len(parts)
    metrics = fit_svi(small_head(), obs, val_fraction=0.2, num_steps=5, log_every=5, seed=4, progress=False)
    assert "val_log_likelihood" in metrics.columns
    with pytest.raises(ValueError, match="val_fraction"):
        split_validation(obs, 1.5)
    with pytest.raises(ValueError, match="patience needs held-out data"):
        fit_svi(small_head(), obs, num_steps=5, patience=2, progress=False)
