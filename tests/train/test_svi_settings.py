"""The SVI settings (pyro_multihop.train.settings): merging, checking, the weight-decay groups of the optimiser,
and the learning defaults on the transitive task, with the stability benchmark at smoke size."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.train import SVI_DEFAULTS, fit_svi, svi_settings
from svi_test_heads import small_head

ROOT = Path(__file__).resolve().parents[2]


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
    from pyro_multihop.train.settings import _parameter_groups

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
