"""EM runs of the command (pyro_multihop.em.em_runs): metrics frames, the checkpoint schema read back, and
non-convergence read from ConvergenceWarning, whatever its text."""

import warnings

import pytest

from pyro_multihop import ConvergenceWarning, transitive_task
from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.em import em_runs


def test_chained_em_run_writes_its_frame_and_checkpoint(tmp_path):
    train, val = transitive_task(80, seed=0), transitive_task(30, seed=1)
    run = em_runs.run_chained_em(train, val, n_hops=2, num_symbols=30, num_targets=30, max_iters=3, tol=0.0,
                                 checkpoint=tmp_path / "em.pt")
    assert list(run.metrics.columns) == ["step", "loss", "val_log_likelihood", "val_accuracy", "seconds"]
    assert run.metrics["step"].tolist() == [0, 1, 2, 3] and run.notes and "did not converge" in run.notes[0]
    model, state = load_checkpoint(tmp_path / "em.pt")
    assert em_runs.training_method(state) == "EM" and state["extra"]["em"]["n_iter"] == run.settings["n_iter"]
    assert run.metrics.attrs["loss_label"] == em_runs.LOSS_LABELS["em"]


def test_variational_em_non_convergence_is_read_from_the_warning_class(tmp_path, monkeypatch):
    from pyro_multihop.em import TiedEmbeddingVEM

    fit = TiedEmbeddingVEM.fit

    def fit_with_other_words(self, obs, max_iters=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            result = fit(self, obs, max_iters)
        warnings.warn("the optimiser ran out of road", ConvergenceWarning)  # no word the old text match knew
        return result

    monkeypatch.setattr(TiedEmbeddingVEM, "fit", fit_with_other_words)
    train = transitive_task(40, num_symbols=10, pairs=3, seed=0)
    run = em_runs.run_variational_em(train, train, n_hops=2, num_symbols=10, num_targets=10, embed_dim=3,
                                     max_iters=3, checkpoint=tmp_path / "vem.pt")
    assert run.notes == [f"note: variational EM stopped at max_iters = 3 before its ELBO settled"]
    frame = run.metrics
    assert frame["step"].tolist()[0] == 1 and frame["val_accuracy"].notna().sum() == 1
    assert frame.attrs["loss_label"] == "negative annealed ELBO per observation (nats)"
    _, state = load_checkpoint(tmp_path / "vem.pt")
    assert em_runs.training_method(state) == "variational EM"


@pytest.mark.parametrize("extra, method", [
    ({"svi": {}}, "SVI"), ({"method": "em", "em": {"method": "variational em"}}, "variational EM"),
    ({"task": 2, "method": "svi"}, "bAbI task 2, SVI"), ({}, "unknown method"),
])
def test_training_method_reads_every_schema(extra, method):
    assert em_runs.training_method({"extra": extra}) == method


@pytest.mark.parametrize("run_em", ["run_chained_em", "run_variational_em"])
def test_the_old_hops_keyword_warns_and_runs_the_same_em(run_em):
    """``hops=`` (renamed ``n_hops``) is kept for one release: it warns, naming ``n_hops``, and fits the same model."""
    train = transitive_task(40, num_symbols=10, pairs=3, seed=0)
    settings = {"num_symbols": 10, "num_targets": 10, "max_iters": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        new = getattr(em_runs, run_em)(train, None, n_hops=2, **settings)
        with pytest.warns(DeprecationWarning, match=rf"{run_em}\(hops=...\) is deprecated; use {run_em}\(n_hops=...\)"):
            old = getattr(em_runs, run_em)(train, None, hops=2, **settings)
    assert old.model.n_hops == new.model.n_hops == 2
    for name, value in new.model.state_dict().items():
        assert (old.model.state_dict()[name] == value).all(), name
    with pytest.raises(TypeError, match="got both 'n_hops' and its old keyword 'hops'"), pytest.warns(DeprecationWarning):
        getattr(em_runs, run_em)(train, None, n_hops=2, hops=2, **settings)
    with pytest.raises(TypeError, match="missing required argument: 'n_hops'"):
        getattr(em_runs, run_em)(train, None, **settings)
