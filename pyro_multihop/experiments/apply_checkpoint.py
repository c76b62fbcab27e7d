"""A trained table checkpoint (``train``, ``babi --encoding positions``) applied to table data: what
``pyro-multihop evaluate``, ``predict``, ``inspect`` and ``paths`` compute and write on a ``.csv`` or ``.parquet``
file (:mod:`pyro_multihop.experiments.apply_commands` sends them here; a qa checkpoint with a facts file goes to
:mod:`pyro_multihop.experiments.qa_apply`).

- :func:`evaluate_file`: mean log-likelihood per observation, accuracy of the most probable target, ``n``.
- :func:`predict_file`: a CSV of target probabilities and MAP hop paths, one row per observation.
- :func:`inspect_checkpoint`: figures of the parameters (key tables, emission, embeddings) and of the posterior
  hop marginals of some rows.
- :func:`write_path_file`: the ``k`` best hop paths of every row (:mod:`pyro_multihop.path_tables`).

Each reads the checkpoint and the data file with one-line errors (:mod:`pyro_multihop.experiments.command_files`)
and refuses a data file beyond the checkpoint's vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

import pandas as pd
import torch

from ..em.em_runs import training_method
from ..path_tables import PATH_FORMATS, write_paths
from ..plots import plot_embeddings, plot_emission, plot_hop_marginals, plot_key_tables
from .command_files import (
    CommandError,
    check_fits,
    checkpoint_words,
    load_context,
    load_data,
    load_model,
    save_figure,
    torch_device,
)

__all__ = ["evaluate_file", "predict_file", "inspect_checkpoint", "write_path_file"]


def evaluate_file(checkpoint: Path, data: Path, device: str = "cpu") -> dict:
    """``{"checkpoint", "data", "model", "log_likelihood", "accuracy", "n"}`` of the checkpoint's head on ``data``."""
    device = torch_device(device)
    model, _ = load_model(checkpoint, device)
    obs = load_data(data)
    check_fits(model, obs, data)
    with torch.no_grad():
        result = model.evaluate(obs.to(device))
    return {"checkpoint": str(checkpoint), "data": str(data), "model": type(model).__name__, **result}


def predict_file(checkpoint: Path, data: Path, out: Path, device: str = "cpu") -> int:
    """Write the predictions CSV of ``data`` to ``out`` (columns: ``pyro-multihop predict --help``); returns the
    number of rows. A data file without a target column is predicted given the query only."""
    if out.suffix != ".csv":
        raise CommandError(f"--out must end in .csv, got {str(out)!r}")
    device = torch_device(device)
    model, _ = load_model(checkpoint, device)
    obs, has_target = load_context(data)
    check_fits(model, obs, data)
    obs = obs.to(device)
    with torch.no_grad():
        probs = model.predict_proba(obs)
        paths = model.map_paths(obs, given_target=has_target)
    probs, paths = probs.cpu(), paths.cpu()
    predicted = probs.argmax(-1)
    columns = {"row": range(len(obs)), "query": obs.query.cpu().numpy()}
    if has_target:
        columns["target"] = obs.target.cpu().numpy()
    columns["predicted"] = predicted.numpy()
    columns["p_predicted"] = probs.gather(1, predicted[:, None]).squeeze(1).numpy()
    if has_target:
        columns["p_target"] = probs.gather(1, obs.target.cpu()[:, None]).squeeze(1).numpy()
    for hop in range(paths.shape[1]):
        columns[f"map_hop_{hop + 1}"] = paths[:, hop].numpy()
    for t in range(probs.shape[1]):
        columns[f"prob_{t}"] = probs[:, t].numpy()
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(columns).to_csv(out, index=False)
    return len(obs)


def inspect_checkpoint(checkpoint: Path, out: Path, data: Optional[Path] = None,
                       rows: Sequence[int] = (0, 1, 2)) -> List[Path]:
    """Draw the checkpoint into the folder ``out``: ``key_tables.png`` (a head with key tables),
    ``embeddings.png`` (a head with embeddings), ``emission.png``, and ``hop_marginals.png`` of ``rows`` of
    ``data`` if given; labelled with the checkpoint's words when it has some. Returns the files written."""
    model, state = load_model(checkpoint, torch.device("cpu"))
    vocabulary = checkpoint_words(state) or {}
    words = {"symbols": vocabulary.get("symbols"), "targets": vocabulary.get("targets")}
    obs = None
    if data is not None:
        obs = load_data(data)
        check_fits(model, obs, data)
        bad = [r for r in rows if r >= len(obs)]
        if bad:
            raise CommandError(f"--rows must be below the {len(obs)} observations of {str(data)!r}, got {bad}")
    out.mkdir(parents=True, exist_ok=True)
    name = f"{type(model).__name__} ({training_method(state)}, {checkpoint})"
    written = []
    if isinstance(getattr(model, "key_tables", None), torch.Tensor):
        figure = plot_key_tables(model, title=f"{name}: key tables", symbols=words["symbols"])
        written.append(save_figure(figure, out / "key_tables.png"))
    if callable(getattr(model, "embeddings", None)):
        figure = plot_embeddings(model, title=f"{name}: embeddings", symbols=words["symbols"])
        written.append(save_figure(figure, out / "embeddings.png"))
    figure = plot_emission(model, title=f"{name}:\nemission p(target | value)", **words)
    written.append(save_figure(figure, out / "emission.png"))
    if obs is not None:
        figure = plot_hop_marginals(model, obs, rows=list(rows), title=f"{name}: posterior hop marginals of "
                                    f"{data.name}", **words)
        written.append(save_figure(figure, out / "hop_marginals.png"))
    return written


def write_path_file(checkpoint: Path, data: Path, out: Path, *, k: int = 3, samples: int = 0, seed: int = 0,
                    chunk: int = 4096, device: str = "cpu", progress: bool = False) -> int:
    """Write the ``k`` best hop paths of every row of ``data`` (and ``samples`` posterior draws) to ``out``,
    ``.csv`` or ``.jsonl`` (:func:`~pyro_multihop.path_tables.write_paths`); returns the number of rows."""
    if out.suffix not in PATH_FORMATS:
        raise CommandError(f"--out must end in {' or '.join(PATH_FORMATS)}, got {str(out)!r}")
    model, state = load_model(checkpoint, torch_device(device))
    obs = load_data(data)
    check_fits(model, obs, data)
    return write_paths(model, obs, out, k=k, num_samples=samples, seed=seed, chunk_size=chunk,
                       vocabulary=checkpoint_words(state), progress=progress)
