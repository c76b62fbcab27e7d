"""Checkpoints: round trips (parameters, dtype, optimiser state, extra), atomic writes, safe loading, errors."""

import os

import pytest
import torch
from pyro.optim.clipped_adam import ClippedAdam

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_parameters,
    read_checkpoint,
    save_checkpoint,
)
from pyro_multihop.models.registry import HEAD_CLASSES


def trained_head(dtype=torch.float32):
    head = ChainedAttention(2, 12, 7, sigma2=0.2, seed=0).to(dtype)
    optimizer = ClippedAdam(head.parameters(), lr=0.01, lrd=0.99)
    obs = transitive_task(30, num_symbols=12, pairs=3, seed=0)
    obs = type(obs)(obs.keys, obs.values, obs.query, obs.target % 7)
    for _ in range(3):
        optimizer.zero_grad()
        (-head.log_likelihood(obs).sum()).backward()
        optimizer.step()
    return head, optimizer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_round_trip_restores_model_dtype_optimizer_and_extra(tmp_path, dtype):
    head, optimizer = trained_head(dtype)
    path = tmp_path / "head.pt"
    save_checkpoint(path, head, optimizer, step=3, extra={"note": "hello", "history": [1.0, 2.0], "t": torch.ones(2)})
    restored, state = load_checkpoint(path)
    assert type(restored) is ChainedAttention and restored.config() == head.config()
    assert restored.key_tables.dtype == dtype
    for name, value in head.state_dict().items():
        assert torch.equal(value, restored.state_dict()[name]), name
    assert state["step"] == 3 and state["dtype"] == str(dtype).replace("torch.", "")
    assert state["extra"]["note"] == "hello" and state["extra"]["history"] == [1.0, 2.0]
    assert torch.equal(state["extra"]["t"], torch.ones(2))
    fresh = ClippedAdam(restored.parameters(), lr=1.0)
    fresh.load_state_dict(state["optimizer"])
    assert fresh.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    original_moments = optimizer.state[head.key_tables]["exp_avg_sq"]
    assert torch.equal(fresh.state[restored.key_tables]["exp_avg_sq"], original_moments)


def test_model_without_optimizer_and_predictions_agree(tmp_path):
    head, _ = trained_head()
    save_checkpoint(tmp_path / "a.pt", head)
    restored, state = load_checkpoint(tmp_path / "a.pt")
    assert state["optimizer"] is None and state["extra"] == {} and state["step"] == 0
    obs = transitive_task(10, num_symbols=12, pairs=3, seed=1)
    assert torch.equal(restored.predict_proba(obs.keys, obs.values, obs.query), head.predict_proba(obs.keys, obs.values, obs.query))


def test_write_is_atomic(tmp_path, monkeypatch):
    head, _ = trained_head()
    path = tmp_path / "head.pt"
    save_checkpoint(path, head, step=1)
    save_checkpoint(path, head, step=2)  # overwrite in place
    assert read_checkpoint(path)["step"] == 2
    assert sorted(os.listdir(tmp_path)) == ["head.pt"]

    def broken_save(obj, stream, *args, **kwargs):
        stream.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, head, step=3)
    assert sorted(os.listdir(tmp_path)) == ["head.pt"]  # no temporary file left behind
    assert read_checkpoint(path)["step"] == 2


class _Gadget:
    """Not a tensor or a plain container: ``torch.load(weights_only=True)`` must refuse it."""


def test_loading_is_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "pyro-multihop-checkpoint", "gadget": _Gadget()}, path)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "does not exist"),
        (b"this is not a checkpoint", "is not a checkpoint"),
        ({"some": "dict"}, "not a pyro-multihop checkpoint"),
        ({"format": "pyro-multihop-checkpoint", "version": 99}, "version"),
        ({"format": "pyro-multihop-checkpoint", "version": 1, "model_class": "ChainedAttention"}, "lacks"),
    ],
    ids=["missing", "garbage", "foreign", "version", "incomplete"],
)
def test_bad_files_raise_checkpoint_error(tmp_path, content, match):
    path = tmp_path / "file.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path)
    assert issubclass(CheckpointError, ValueError)


@pytest.mark.parametrize("keep", [0.02, 0.5, 0.98], ids=["head", "half", "tail-cut"])
def test_a_truncated_checkpoint_is_one_short_sentence(tmp_path, keep):
    head, optimizer = trained_head()
    path = tmp_path / "head.pt"
    save_checkpoint(path, head, optimizer, step=3)
    data = path.read_bytes()
    path.write_bytes(data[: max(4, int(keep * len(data)))])
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == f"checkpoint {str(path)!r} is truncated or damaged"


def test_a_data_file_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "train.csv"
    transitive_task(5, seed=0).save(path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value) == f"{str(path)!r} is not a checkpoint (train writes OUT/checkpoint.pt)"


@pytest.mark.parametrize("head_class", ["ChainedAttention", "TiedEmbeddingAttention"])
def test_checkpoints_with_the_old_unconstrained_names_are_refused_with_what_to_do(tmp_path, head_class):
    from pyro_multihop import TiedEmbeddingAttention

    head = trained_head()[0] if head_class == "ChainedAttention" else TiedEmbeddingAttention(6, 2, 6, seed=3)
    path = tmp_path / "head.pt"
    save_checkpoint(path, head)
    payload = read_checkpoint(path)
    old_names = {"key_tables": "key_tables_unconstrained", "emission_logits": "emission_logits_unconstrained",
                 "guide.loc": "guide.loc_unconstrained"}
    payload["state_dict"] = {old_names.get(k, k): v for k, v in payload["state_dict"].items()}
    del payload["sha256"]  # the checkpoints of that time had none
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    message = str(caught.value)
    assert message.startswith(f"checkpoint {str(path)!r}: parameter ") and "_unconstrained' has the name" in message
    assert "rename every entry NAME_unconstrained of its 'state_dict' to NAME" in message


def _saved_payload(tmp_path):
    head, _ = trained_head()
    path = tmp_path / "head.pt"
    save_checkpoint(path, head)
    return path, read_checkpoint(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda p: p.update(state_dict=list(p["state_dict"].items())), "entry 'state_dict' must be a dictionary of tensors, got a list"),
        (lambda p: p.update(config=[1, 2]), "entry 'config' must be a dictionary, got a list"),
        (lambda p: p.update(step="3"), "entry 'step' must be a non-negative integer, got a str '3'"),
        (lambda p: p["state_dict"].update(key_tables=p["state_dict"]["key_tables"].long()),
         "parameter 'key_tables' must have dtype torch.float32 like the model's, got torch.int64"),
        (lambda p: p["state_dict"]["emission_logits"].__setitem__((1, 2), float("nan")),
         "parameter 'emission_logits' must be finite, got nan at index (1, 2)"),
        (lambda p: p["state_dict"]["key_tables"].__setitem__((0, 0, 3), float("-inf")),
         "parameter 'key_tables' must be finite, got -inf at index (0, 0, 3)"),
        (lambda p: p["state_dict"].update(key_tables=p["state_dict"]["key_tables"][:1]),
         "parameter 'key_tables' must have shape (2, 12, 12), got (1, 12, 12)"),
        (lambda p: p["state_dict"].pop("emission_logits"), "parameter 'emission_logits' of ChainedAttention is missing"),
        (lambda p: p["state_dict"].update(extra=torch.zeros(2)), "parameter 'extra' is not a parameter of ChainedAttention"),
        (lambda p: p["state_dict"].update(key_tables=[[0.0]]), "parameter 'key_tables' must be a tensor, got a list"),
        (lambda p: p.update(vocabulary=["a", "b", "a"]), "entry 'vocabulary' must hold distinct strings; symbols 0 and 2"),
        (lambda p: p.update(vocabulary=["a", 3]), "entry 'vocabulary' must hold strings; symbol 1 is a int 3"),
    ],
    ids=["state-list", "config-list", "step-text", "int-tables", "nan", "inf", "shape", "missing", "unknown",
         "not-tensor", "vocabulary-duplicate", "vocabulary-number"],
)
def test_a_bad_entry_or_parameter_is_named(tmp_path, edit, message):
    path, payload = _saved_payload(tmp_path)
    del payload["sha256"]  # as a file written without a digest (the digest would name the change as damage)
    edit(payload)
    torch.save(payload, path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(path)
    assert str(caught.value).startswith(f"checkpoint {str(path)!r}: ") and message in str(caught.value), caught.value


def test_a_changed_parameter_or_setting_breaks_the_digest(tmp_path):
    path, payload = _saved_payload(tmp_path)
    for edit in (lambda p: p["state_dict"]["key_tables"].__setitem__((1, 2, 3), 0.5), lambda p: p.update(step=7)):
        changed = {**payload, "state_dict": {k: v.clone() for k, v in payload["state_dict"].items()}}
        edit(changed)
        torch.save(changed, path)
        with pytest.raises(CheckpointError, match="is damaged: its parameters or configuration do not match"):
            load_checkpoint(path)


def test_vocabulary_round_trip_and_checks(tmp_path):
    head, _ = trained_head()
    words = [f"w{i}" for i in range(12)]
    save_checkpoint(tmp_path / "head.pt", head, vocabulary=words)
    assert load_checkpoint(tmp_path / "head.pt")[1]["vocabulary"] == words
    save_checkpoint(tmp_path / "plain.pt", head)
    assert load_checkpoint(tmp_path / "plain.pt")[1]["vocabulary"] is None
    with pytest.raises(TypeError, match="vocabulary must be a list of strings"):
        save_checkpoint(tmp_path / "x.pt", head, vocabulary="abc")
    with pytest.raises(ValueError, match="symbols 0 and 1 are both 'a'"):
        save_checkpoint(tmp_path / "x.pt", head, vocabulary=["a", "a"])


def test_unknown_class_and_bad_config(tmp_path):
    head, _ = trained_head()
    path = tmp_path / "head.pt"
    save_checkpoint(path, head)
    payload = read_checkpoint(path)
    del payload["sha256"]  # as a file written without a digest (the digest would name the change as damage)
    payload["model_class"] = "NoSuchHead"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="NoSuchHead"):
        load_checkpoint(path)
    payload["model_class"] = "ChainedAttention"
    payload["config"] = {"n_hops": 0, "num_symbols": 12, "num_targets": 7}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="cannot rebuild"):
        load_checkpoint(path)


def test_load_parameters_checks_class_and_config(tmp_path):
    head, _ = trained_head()
    save_checkpoint(tmp_path / "head.pt", head)
    payload = read_checkpoint(tmp_path / "head.pt")
    with pytest.raises(CheckpointError, match="configuration"):
        load_parameters(ChainedAttention(2, 12, 7, sigma2=0.3), payload)
    other = ChainedAttention(2, 12, 7, sigma2=0.2, seed=5)
    load_parameters(other, payload)
    assert torch.equal(other.key_tables, head.key_tables)


def test_save_rejects_unregistered_models_and_missing_folders(tmp_path):
    class Custom(ChainedAttention):
        pass

    with pytest.raises(CheckpointError, match="must be one of"):
        save_checkpoint(tmp_path / "x.pt", Custom(1, 3, 3))
    with pytest.raises(CheckpointError, match="folder"):
        save_checkpoint(tmp_path / "no" / "such" / "x.pt", ChainedAttention(1, 3, 3))


def test_loading_leaves_the_global_rng_alone(tmp_path):
    head, _ = trained_head()
    save_checkpoint(tmp_path / "head.pt", head)
    state = torch.get_rng_state()
    load_checkpoint(tmp_path / "head.pt")
    assert torch.equal(torch.get_rng_state(), state)


def test_tied_head_round_trip(tmp_path):
    tied = pytest.importorskip("pyro_multihop.models.tied")
    head = tied.TiedEmbeddingAttention(10, 3, 10, seed=0).double()
    with torch.no_grad():
        head.emission_logits.normal_()
    save_checkpoint(tmp_path / "tied.pt", head)
    restored, state = load_checkpoint(tmp_path / "tied.pt")
    assert type(restored).__name__ == "TiedEmbeddingAttention" and state["dtype"] == "float64"
    for name, value in head.state_dict().items():
        assert torch.equal(value, restored.state_dict()[name]), name
    assert "TiedEmbeddingAttention" in HEAD_CLASSES


def test_model_classes_is_a_deprecated_alias_of_the_registry():
    import pyro_multihop.checkpoint as checkpoint

    with pytest.warns(DeprecationWarning, match="models.registry.HEAD_CLASSES"):
        classes = checkpoint.MODEL_CLASSES
    assert classes == {"ChainedAttention": "pyro_multihop.models.chained:ChainedAttention",
                       "TiedEmbeddingAttention": "pyro_multihop.models.tied:TiedEmbeddingAttention",
                       "FactAttention": "pyro_multihop.models.facts:FactAttention"}
    assert checkpoint.model_class("FactAttention") is HEAD_CLASSES["FactAttention"]
    with pytest.raises(AttributeError):
        checkpoint.NO_SUCH_NAME


def test_checkpoint_is_a_plain_dictionary(tmp_path):
    head, optimizer = trained_head()
    save_checkpoint(tmp_path / "head.pt", head, optimizer, step=4)
    payload = torch.load(tmp_path / "head.pt", weights_only=True)
    assert payload["format"] == "pyro-multihop-checkpoint" and payload["version"] == 1
    assert payload["model_class"] == "ChainedAttention" and payload["config"] == head.config()
    assert set(payload) == {"format", "version", "model_class", "config", "dtype", "state_dict", "optimizer", "step", "extra",
                            "vocabulary", "sha256"}
