"""What ``pyro-multihop evaluate``, ``predict``, ``paths`` and ``inspect`` do: match a checkpoint with a data file
by their kinds, then apply the one to the other; the command prints what these functions return.

Two kinds of each:

- a *table* checkpoint (a chained or tied head, written by ``train`` or ``babi --encoding positions``) takes
  table data, a ``.csv`` or ``.parquet`` file (:mod:`pyro_multihop.experiments.apply_checkpoint` does the work);
- a *qa* checkpoint (the structured-facts head with its vocabulary, written by ``qa`` or ``babi``, whose
  default encoding is facts) takes a facts file, ``.jsonl`` (docs/qa.md), read as strictly as the ``qa``
  command reads its files (:func:`~pyro_multihop.datasets.qa_jsonl.read_qa_jsonl`; ``answer`` may be left out
  except for ``evaluate``), and :mod:`pyro_multihop.experiments.qa_apply` does the work.

:func:`open_checkpoint` tells them apart by the checkpoint's head (a ``FactAttention``, or an ``extra["qa"]``
vocabulary) and the file's suffix, and refuses a pair that does not fit with one line saying which file each
kind takes. On a facts file the outputs are JSON Lines, one line per question, carrying its ``id``, its
question, the predicted answer and each hop's fact (index and tokens).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from ..checkpoint import load_checkpoint
from ..datasets.qa_jsonl import answers_outside_facts_message, read_qa_jsonl, write_jsonl
from . import apply_checkpoint
from .command_defaults import FACTS_SUFFIX, TABLE_SUFFIXES
from .command_files import CommandError, save_figure, torch_device
from .qa import qa_model
from .qa_apply import evaluate_records, inspect_records, path_records, predict_records

__all__ = ["is_facts_file", "open_checkpoint", "evaluate_command",
           "predict_command", "paths_command", "inspect_command"]

#: The head class of a qa checkpoint.
FACTS_HEAD = "FactAttention"

Log = Optional[Callable[[str], None]]


def is_facts_file(path: Path) -> bool:
    """Whether ``path`` names a facts file (``.jsonl``) rather than table data."""
    return Path(path).suffix == FACTS_SUFFIX


def open_checkpoint(checkpoint: Path, data: Optional[Path]) -> Optional[tuple]:
    """Load ``checkpoint`` and check that ``data`` (None: no data file) is of the kind it takes; returns the
    model ``(head, vocabulary, state)`` of a qa checkpoint, None for a table checkpoint.

    :raises CommandError: one line naming the checkpoint's kind and the file it takes, when they do not fit.
    :raises CheckpointError: when the checkpoint cannot be read; ``ValueError`` for a structured-facts head
        saved without its vocabulary."""
    head, state = load_checkpoint(checkpoint)
    takes_facts = state["model_class"] == FACTS_HEAD or "qa" in state["extra"]
    if data is not None and takes_facts and not is_facts_file(data):
        raise CommandError(f"checkpoint {str(checkpoint)!r} is a qa checkpoint (the structured-facts head, written by "
                           f"qa or babi): it takes a facts {FACTS_SUFFIX} file (docs/qa.md), not {str(data)!r}")
    if data is not None and not takes_facts and is_facts_file(data):
        raise CommandError(f"checkpoint {str(checkpoint)!r} holds a {state['model_class']} for table data (written by "
                           f"train or babi --encoding positions): it takes a {' or '.join(TABLE_SUFFIXES)} data file; "
                           f"a facts file {str(data)!r} needs a checkpoint of qa or babi --encoding facts")
    return qa_model(head, state, checkpoint) if takes_facts else None


def _questions(data: Path, device: str, log: Log) -> list:
    """The records of a facts file (answers optional), after checking that ``device`` is the CPU; notes the
    answers that no fact of their question holds."""
    if torch_device(device).type != "cpu":
        raise CommandError(f"--device {device}: a qa checkpoint is applied on the CPU only; leave --device out")
    if not Path(data).is_file():
        raise CommandError(f"data file {str(data)!r} does not exist")
    records = read_qa_jsonl(data, require_answer=False)
    message = answers_outside_facts_message(records, "test")
    if message is not None and log is not None:
        log(f"warning: {message}")
    return records


def _jsonl_out(out: Path, what: str) -> Path:
    if out.suffix != FACTS_SUFFIX:
        raise CommandError(f"--out: the {what} of a facts file are JSON Lines, so --out must end in {FACTS_SUFFIX}, "
                           f"got {str(out)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def evaluate_command(checkpoint: Path, data: Path, device: str = "cpu", log: Log = None) -> dict:
    """``{"checkpoint", "data", "model", ...scores}``: on table data the log-likelihood, accuracy and ``n``
    (:func:`~pyro_multihop.experiments.apply_checkpoint.evaluate_file`); on a facts file, whose every question
    needs its answer, the scores of the ``qa`` run's ``results.json`` (``answer_accuracy``, ``fact_accuracy``,
    ``hop_fact_accuracy``, ``n``, ``log_likelihood``: None where not finite) and ``answers_outside_facts``
    (:func:`~pyro_multihop.experiments.qa_apply.evaluate_records`)."""
    model = open_checkpoint(checkpoint, data)
    if model is None:
        return apply_checkpoint.evaluate_file(checkpoint, data, device)
    scores = evaluate_records(model, _questions(data, device, log))
    if scores["log_likelihood"] is not None and not math.isfinite(scores["log_likelihood"]):
        scores["log_likelihood"] = None
    return {"checkpoint": str(checkpoint), "data": str(data), "model": type(model[0]).__name__, **scores}


def predict_command(checkpoint: Path, data: Path, out: Path, device: str = "cpu", log: Log = None) -> str:
    """Write the predictions of ``data`` to ``out``; returns the line to print. Table data: a CSV
    (:func:`~pyro_multihop.experiments.apply_checkpoint.predict_file`); a facts file: JSON Lines, per question
    its ``id``, ``question``, ``answer``, ``answer_prob``, the question-only MAP path's ``facts`` and
    ``fact_tokens``, and ``given_answer`` with ``correct`` where it has an answer
    (:func:`~pyro_multihop.experiments.qa_apply.predict_records`)."""
    model = open_checkpoint(checkpoint, data)
    if model is None:
        rows = apply_checkpoint.predict_file(checkpoint, data, out, device)
        return f"wrote predictions for {rows} observations to {out}"
    _jsonl_out(out, "predictions")
    lines = predict_records(model, _questions(data, device, log))
    write_jsonl(lines, out)
    return f"wrote predictions for {len(lines)} questions to {out}"


def paths_command(checkpoint: Path, data: Path, out: Path, *, k: int = 3, samples: int = 0, seed: int = 0,
                  chunk: int = 4096, device: str = "cpu", progress: bool = False, log: Log = None) -> str:
    """Write the ``k`` best hop paths of every row or question of ``data`` to ``out``; returns the line to print.
    Table data: given the target, ``.csv`` or ``.jsonl``, in chunks of ``chunk`` rows
    (:func:`~pyro_multihop.experiments.apply_checkpoint.write_path_file`). A facts file: JSON Lines, per
    question the ``question_only`` paths (``k_best``, ``entropy``, ``samples``) and, where it has an answer,
    ``given_answer_paths`` (:func:`~pyro_multihop.experiments.qa_apply.path_records`; chunked by the engine's
    memory budget)."""
    model = open_checkpoint(checkpoint, data)
    if model is None:
        rows = apply_checkpoint.write_path_file(checkpoint, data, out, k=k, samples=samples, seed=seed, chunk=chunk,
                                                device=device, progress=progress)
        return f"wrote the {k} best paths of {rows} rows to {out}"
    _jsonl_out(out, "paths")
    records = _questions(data, device, log)
    lines = path_records(model, records, k=k, num_samples=samples, seed=seed)
    write_jsonl(lines, out)
    answered = sum(record.answer is not None for record in records)
    given = f", and given the answer for the {answered} with one" if answered else ""
    return f"wrote the {k} best paths of {len(lines)} questions to {out} (given the question alone{given})"


def inspect_command(checkpoint: Path, out: Path, data: Optional[Path] = None, rows: Sequence[int] = (0, 1, 2),
                    log: Log = None) -> List[Path]:
    """Draw the checkpoint into the folder ``out``; returns the files written. A table checkpoint: its
    parameters, and the hop marginals of ``rows`` of ``data``
    (:func:`~pyro_multihop.experiments.apply_checkpoint.inspect_checkpoint`). A qa checkpoint needs a facts
    file: ``hop_marginals.png``, the hop marginals over the facts of ``rows``, given the answer where the
    question has one, else given the question alone
    (:func:`~pyro_multihop.experiments.qa_apply.inspect_records`)."""
    model = open_checkpoint(checkpoint, data)
    if model is None:
        return apply_checkpoint.inspect_checkpoint(checkpoint, out, data, rows)
    if data is None:
        raise CommandError(f"checkpoint {str(checkpoint)!r} is a qa checkpoint: inspect draws it on questions, "
                           f"give --data FILE{FACTS_SUFFIX} (a facts file)")
    records = _questions(data, "cpu", log)
    bad = [row for row in rows if row >= len(records)]
    if bad:
        raise CommandError(f"--rows must be below the {len(records)} questions of {str(data)!r}, got {bad}")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    figure = inspect_records(model, records, rows, title=f"{type(model[0]).__name__} ({checkpoint}): hop marginals "
                             f"over the facts of {Path(data).name}")
    written = save_figure(figure, out / "hop_marginals.png")
    plt.close(figure)
    return [written]
