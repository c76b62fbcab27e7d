"""Training from data files without the command line: start_training checks and reads, finish_training fits,
writes the outputs and returns the lines the command prints."""

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from pyro_multihop import transitive_task
from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.experiments.command_files import CommandError
from pyro_multihop.experiments.train_files import TrainFilesSettings, finish_training, start_training, training_title
from pyro_multihop.models.registry import default_sigma2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    transitive_task(80, seed=0).save(folder / "train.csv")
    transitive_task(30, seed=1).save(folder / "val.csv")
    return folder


def settings(data: Path, out: Path, **options) -> TrainFilesSettings:
    """The settings of ``pyro-multihop train --data DATA --out OUT --no-progress`` and ``options``."""
    defaults = dict(val=None, valid_fraction=None, patience=None, model="chained", method="svi", hops=2, sigma2=None,
                    embed_dim=8, symbols=None, targets=None, steps=None, lr=None, batch_size=None, tol=1e-6, seed=0,
                    starts=1, processes=None, device="cpu", dtype="float32", log_every=None, checkpoint_every=None, resume=False,
                    overwrite=False, jit=False, collapsed=False, no_progress=True)
    return TrainFilesSettings(data=data, out=out, **{**defaults, **options})


def test_an_svi_run_writes_its_outputs_and_reports_them(files, tmp_path):
    out = tmp_path / "svi"
    run = start_training(settings(files / "train.csv", out, val=files / "val.csv", steps=6, log_every=3))
    assert run.is_main and run.resume_step is None and run.num_symbols == run.num_targets == 30
    assert run.model.sigma2 == default_sigma2("chained") and run.checkpoint == out / "checkpoint.pt"
    report = finish_training(run)
    assert report.summary == json.loads((out / "summary.json").read_text())
    assert report.summary["settings"]["num_steps"] == 6 and report.summary["val"]["n"] == 30
    assert report.lines[0].startswith("chained/svi: ") and "train log-likelihood" in report.lines[0]
    assert report.lines[1].startswith("held-out log-likelihood") and report.lines[-1].startswith("wrote ")
    for name in ("checkpoint.pt", "metrics.csv", "loss.png", "accuracy.png", "summary.json"):
        assert str(out / name) in report.lines[-1] and (out / name).is_file(), name
    assert pd.read_csv(out / "metrics.csv")["step"].tolist() == [0, 3, 6]

    again = start_training(settings(files / "train.csv", out, val=files / "val.csv", steps=6, log_every=3, resume=True))
    assert again.resume_step == 6  # the finished run, to resume


def test_an_em_run_takes_the_registry_gate_variance(files, tmp_path):
    out = tmp_path / "em"
    run = start_training(settings(files / "train.csv", out, method="em", steps=2))
    assert run.model is None and run.resume_step is None
    report = finish_training(run)
    assert report.summary["settings"]["sigma2"] == default_sigma2("chained")
    assert report.summary["settings"]["max_iters"] == 2 and report.lines[-1].startswith("wrote ")
    assert any(line.startswith("note: EM did not converge in 2 iterations") for line in report.lines)
    _, state = load_checkpoint(out / "checkpoint.pt")
    assert state["extra"]["method"] == "em"


@pytest.mark.parametrize("options, message", [
    (dict(val="val.csv", valid_fraction=0.2), "not both"),
    (dict(patience=2), "--patience needs held-out data"),
    (dict(method="em", lr=0.1), "svi only"),
    (dict(method="em", model="tied", batch_size=4), "svi only"),
    (dict(method="em", starts=2), "--starts 2: several starts are an SVI option"),
    (dict(device="warp-drive"), "--device must be a torch device"),
    (dict(symbols=5), "does not fit --symbols/--targets"),
])
def test_refusals_come_before_anything_is_written(files, tmp_path, options, message):
    if "val" in options:
        options["val"] = files / options["val"]
    out = tmp_path / "refused"
    with pytest.raises(CommandError, match=message):
        start_training(settings(files / "train.csv", out, **options))
    assert not out.exists()


def test_a_trained_folder_needs_resume_or_overwrite_and_resume_needs_the_same_head(files, tmp_path):
    out = tmp_path / "run"
    finish_training(start_training(settings(files / "train.csv", out, steps=2)))
    with pytest.raises(CommandError, match="already holds a trained checkpoint"):
        start_training(settings(files / "train.csv", out, steps=2))
    with pytest.raises(CommandError, match="n_hops = 2 there, 3 here"):
        start_training(settings(files / "train.csv", out, steps=4, hops=3, resume=True))
    assert start_training(settings(files / "train.csv", out, steps=2, overwrite=True)).resume_step is None


def test_the_settings_are_the_train_command_options():
    from pyro_multihop.cli import build_parser

    args = build_parser().parse_args(["train", "--data", "d.csv", "--out", "o"])
    options = {field.name for field in dataclasses.fields(TrainFilesSettings)}
    assert options == set(vars(args)) - {"command", "verbose", "threads"}


def test_training_titles_name_the_method_and_the_data():
    import argparse

    val = transitive_task(7, seed=1)
    for model, method, expected_method, expected_x in (
        ("chained", "svi", "SVI", "step"), ("chained", "em", "EM", "EM iteration"),
        ("tied", "em", "variational EM", "variational EM iteration"),
    ):
        args = argparse.Namespace(model=model, method=method, data=Path("runs/train.csv"), val=Path("test.csv"))
        title, x_label = training_title(args, 20, val)
        assert title == f"{model} head, {expected_method} on train.csv (20 rows); held-out test.csv (7 rows)"
        assert x_label == expected_x
