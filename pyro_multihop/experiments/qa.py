"""Multi-hop question answering from facts files: training, evaluation, outputs, and the ``pyro-multihop qa`` command.

::

    pyro-multihop qa --train train.jsonl --test test.jsonl --hops 2 --out runs/qa

reads two QA JSON Lines files (:mod:`pyro_multihop.datasets.qa_jsonl`; every line of both is checked
before anything is trained), builds the vocabulary from the training file, trains the structured-facts
head by :func:`~pyro_multihop.train.fit_svi` on question-answer pairs alone (supporting facts, if given, only
score), and writes into ``OUT`` (the command's options: :mod:`pyro_multihop.experiments.qa_command`):

- ``results.json``: ``answer_accuracy``, ``fact_accuracy`` (null when the test file has no ``supporting``),
  ``n_train``, ``n_test``, ``hops``, ``seconds`` (training), ``log_likelihood`` (test, mean per question);
- ``predictions.jsonl``: one line per test question, in order: ``{"answer": str, "answer_prob": float,
  "facts": [fact index per hop]}``; the answer is the most probable one, ``facts`` the most probable hop
  path given the facts and the question, *not* the answer (the path the model follows at test time);
- ``hop_posteriors.png``: posterior hop marginals over the facts of the first test questions given their
  answers, supporting facts starred, the question's MAP path dotted;
- ``checkpoint.pt``: the head, its training state and the vocabulary (``extra["qa"]``), read back by
  :func:`load_qa_checkpoint`.

bAbI goes through the same path: :func:`run_babi_facts` turns a task's stories into records
(:mod:`pyro_multihop.datasets.babi_facts`) and calls :func:`run_qa`.
"""

from __future__ import annotations

import json
import math
import time
import types
from pathlib import Path
from typing import List, Optional, Sequence

import torch
from matplotlib.figure import Figure

from ..checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from ..data import FactObservations
from ..datasets.babi import DEFAULT_MEMORY
from ..datasets.babi_facts import load_task_records
from ..datasets.qa_jsonl import QAData, QARecord, QAVocabulary
from ..models.facts import FactAttention
from ..runs import CHECKPOINT_NAME, prepare_run_dir
from ..train import fit_svi

__all__ = [
    "facts_head",
    "LengthGroupedFacts",
    "train_qa",
    "evaluate_qa",
    "predict_qa",
    "plot_fact_posteriors",
    "run_qa",
    "run_babi_facts",
    "load_qa_checkpoint",
]

#: Length groups of ``fit_svi`` (rows cut to their own number of facts, rounded up to this many): exact.
GROUP_LENGTHS = 10


def facts_head(vocabulary: QAVocabulary, hops: int, max_question_len: int):
    """The structured-facts head (:class:`~pyro_multihop.models.facts.FactAttention`) sized for
    ``vocabulary``: ``hops`` hops over facts of ``vocabulary.num_fields`` fields, one table of
    ``vocabulary.num_symbols`` symbols, questions of up to ``max_question_len`` tokens. Its parameters start
    at zero (uniform attention), so the head needs no seed."""
    return FactAttention(hops, vocabulary.num_fields, vocabulary.num_symbols, max_question_len=max_question_len)


class LengthGroupedFacts(FactObservations):
    """:class:`~pyro_multihop.data.FactObservations` that :func:`~pyro_multihop.train.fit_svi` can group
    by length (``group_lengths``): each row's number of facts and a cut to the first ``width`` facts. The
    cut is exact for rows with at most ``width`` facts (padded facts get no attention), and saves most of
    the ``O(N^2)`` work where most rows hold far fewer facts than the longest (bAbI task 2: 15 of 50)."""

    @classmethod
    def of(cls, obs: FactObservations) -> "LengthGroupedFacts":
        return cls(obs.facts, obs.question, obs.target, obs.fact_mask, obs.field_mask, obs.question_mask, obs.supporting)

    def context_lengths(self) -> torch.Tensor:
        """``(n,)``: each row's last real fact + 1."""
        return self.full_mask().long().cumsum(-1).argmax(-1) + 1

    def truncate_context(self, width: int) -> "LengthGroupedFacts":
        """The first ``width`` facts of every row (the supporting facts are dropped: training never reads them)."""
        field_mask = None if self.field_mask is None else self.field_mask[:, :width]
        return LengthGroupedFacts(self.facts[:, :width], self.question, self.target, self.full_mask()[:, :width],
                                  field_mask, self.question_mask)


def train_qa(head, train: QAData, *, steps=None, lr=None, batch_size=None, valid_fraction=None, seed: int = 0,
             collapsed: bool = False, checkpoint=None, resume: bool = False, progress: bool = False):
    """Fit ``head`` to the training questions by SVI (:func:`~pyro_multihop.train.fit_svi`, the head's own
    defaults for what is left None); returns fit_svi's metrics."""
    return fit_svi(head, LengthGroupedFacts.of(train.obs), num_steps=steps, lr=lr, batch_size=batch_size,
                   val_fraction=valid_fraction, seed=seed, collapsed=collapsed, checkpoint=checkpoint, resume=resume,
                   progress=progress, group_lengths=GROUP_LENGTHS)


@torch.no_grad()
def predict_qa(head, data: QAData) -> List[dict]:
    """Per question: ``{"answer": text, "answer_prob": p, "facts": [fact per hop]}`` (the MAP path given the
    question, not the answer: ``map_paths(given_target=False)``)."""
    probs = head.predict_proba(data.obs)
    answer_prob, predicted = probs.max(-1)
    paths = head.map_paths(data.obs, given_target=False)
    return [
        {"answer": data.answer_text(row, symbol), "answer_prob": float(p), "facts": path}
        for row, (symbol, p, path) in enumerate(zip(predicted.tolist(), answer_prob.tolist(), paths.tolist()))
    ]


@torch.no_grad()
def evaluate_qa(head, data: QAData, predictions: Optional[List[dict]] = None) -> dict:
    """``answer_accuracy`` (the predicted answer's text equals the answer), ``fact_accuracy`` (the
    question's MAP path visits the supporting facts in order; None without them), ``hop_fact_accuracy``
    (per hop, the share that attends that hop's supporting fact), ``n`` and the mean test ``log_likelihood``."""
    predictions = predict_qa(head, data) if predictions is None else predictions
    hits = [prediction["answer"] == record.answer for prediction, record in zip(predictions, data.records)]
    paths = torch.tensor([prediction["facts"] for prediction in predictions], dtype=torch.long)
    log_likelihood = float(head.log_likelihood(data.obs).mean())
    return {
        "answer_accuracy": sum(hits) / len(hits),
        "fact_accuracy": data.fact_accuracy(paths),
        "hop_fact_accuracy": data.hop_fact_accuracy(paths),
        "n": len(data),
        "log_likelihood": log_likelihood if math.isfinite(log_likelihood) else None,
    }


def plot_fact_posteriors(head, data: QAData, rows: Sequence[int], title: Optional[str] = None,
                         max_facts: int = 14) -> Figure:
    """Posterior hop marginals ``p(z_l = fact | facts, question, answer)`` of some questions: one panel a
    question, facts down (the last ``max_facts``, text as labels, supporting facts starred), hops across,
    the MAP path given the question alone dotted; one colour bar."""
    rows = [int(row) for row in rows]
    if not rows or any(not 0 <= row < len(data) for row in rows):
        raise ValueError(f"rows must be indices into the {len(data)} questions, got {rows}")
    subset = data.obs[torch.tensor(rows)]
    with torch.no_grad():
        marginals = head.posterior(subset).hop_marginals.cpu()  # (L, r, N)
        paths = head.map_paths(subset, given_target=False).cpu()
    hops = marginals.shape[0]
    figure = Figure(figsize=(3.6 * len(rows) + 1.2, 0.3 * max_facts + 1.8), layout="constrained")
    axes = figure.subplots(1, len(rows), squeeze=False)[0]
    image = None
    for column, (axis, row) in enumerate(zip(axes, rows)):
        record = data.records[row]
        first = max(0, len(record.facts) - max_facts)
        shown = marginals[:, column, first : len(record.facts)].t().numpy()  # (facts, L)
        image = axis.imshow(shown, cmap="Blues", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        path = paths[column].tolist()
        axis.scatter(range(hops), [fact - first for fact in path], color="C3", s=16, label="MAP path given the question")
        support = set(record.supporting or ())
        labels = [f"{'*' if index in support else ' '}{index}: {' '.join(fact)}"
                  for index, fact in enumerate(record.facts)][first:]
        axis.set_yticks(range(len(labels)), labels, fontsize=7)
        axis.set_xticks(range(hops), [f"hop {hop + 1}" for hop in range(hops)])
        order = f"supporting {' '.join(map(str, record.supporting))}" if record.supporting else "no supporting facts"
        axis.set_title(f"{' '.join(record.question)} -> {record.answer}\n(* {order})", fontsize=8)
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="posterior probability")
    figure.suptitle(title or "posterior hop marginals over facts, given question and answer", fontsize=9)
    return figure


def _attach_vocabulary(checkpoint: Path, head, vocabulary: QAVocabulary, hops: int) -> None:
    """Add the vocabulary to the checkpoint fit_svi wrote, keeping its optimiser and training state."""
    payload = read_checkpoint(checkpoint)
    stored_optimizer = None if payload["optimizer"] is None else types.SimpleNamespace(state_dict=lambda: payload["optimizer"])
    extra = dict(payload["extra"])
    extra["qa"] = {"vocabulary": vocabulary.to_dict(), "hops": hops}
    save_checkpoint(checkpoint, head, stored_optimizer, step=payload["step"], extra=extra)


def load_qa_checkpoint(path):
    """``(head, vocabulary, state)`` of a checkpoint written by :func:`run_qa`."""
    head, state = load_checkpoint(path)
    qa = (state.get("extra") or {}).get("qa")
    if qa is None:
        raise ValueError(f"checkpoint {str(path)!r} holds no QA vocabulary (extra['qa']): not written by the qa command")
    return head, QAVocabulary.from_dict(qa["vocabulary"]), state


def _json_number(value):
    return value if value is None or math.isfinite(value) else None


def run_qa(train_records: Sequence[QARecord], test_records: Sequence[QARecord], hops: int, out, *, seed: int = 0,
           steps=None, lr=None, batch_size=None, valid_fraction=None, collapsed: bool = False, resume: bool = False,
           overwrite: bool = False, figure_rows: int = 3, progress: bool = False, extra: Optional[dict] = None) -> dict:
    """Train the structured-facts head on ``train_records``, evaluate on ``test_records``, write the outputs
    of the module docstring into ``out`` (refused if it holds a checkpoint, unless ``resume``/``overwrite``);
    returns the results."""
    out = prepare_run_dir(out, resume=resume, overwrite=overwrite, resumable=True)
    checkpoint = out / CHECKPOINT_NAME
    vocabulary = QAVocabulary.build(train_records)
    train, test = vocabulary.encode(train_records), vocabulary.encode(test_records)
    longest_question = max(len(record.question) for records in (train_records, test_records) for record in records)
    head = facts_head(vocabulary, hops, longest_question)
    started = time.perf_counter()
    train_qa(head, train, steps=steps, lr=lr, batch_size=batch_size, valid_fraction=valid_fraction, seed=seed,
             collapsed=collapsed, checkpoint=checkpoint, resume=resume, progress=progress)
    seconds = time.perf_counter() - started
    _attach_vocabulary(checkpoint, head, vocabulary, hops)
    predictions = predict_qa(head, test)
    scores = evaluate_qa(head, test, predictions)
    results = {
        "answer_accuracy": scores["answer_accuracy"],
        "fact_accuracy": scores["fact_accuracy"],
        "n_train": len(train),
        "n_test": len(test),
        "hops": hops,
        "seconds": round(seconds, 2),
        "log_likelihood": _json_number(scores["log_likelihood"]),
        "hop_fact_accuracy": scores["hop_fact_accuracy"],
        **(extra or {}),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    with open(out / "predictions.jsonl", "w", encoding="utf-8") as handle:
        for prediction in predictions:
            handle.write(json.dumps(prediction, ensure_ascii=False, allow_nan=False) + "\n")
    rows = range(min(figure_rows, len(test)))
    figure = plot_fact_posteriors(head, test, rows, title=f"{type(head).__name__}, {hops} hops: posterior hop "
                                  "marginals over facts (given question and answer)")
    figure.savefig(out / "hop_posteriors.png", dpi=110, bbox_inches="tight")
    return results


def run_babi_facts(task: int, out, *, data_dir=None, train_dir=None, hops: Optional[int] = None,
                   memory: int = DEFAULT_MEMORY, max_train: Optional[int] = None, **options) -> dict:
    """A bAbI task through the facts path: its stories as facts records
    (:func:`~pyro_multihop.datasets.babi_facts.load_task_records`), then :func:`run_qa` with ``hops`` (default:
    the most supporting facts of a training question, the task's number); the results add ``task``,
    ``memory`` and ``encoding = "facts"``."""
    train, test = load_task_records(task, data_dir=data_dir, train_dir=train_dir, memory=memory, max_train=max_train)
    if hops is None:
        hops = max(1, max(len(record.supporting or ()) for record in train))
    return run_qa(train, test, hops, out, extra={"task": task, "memory": memory, "encoding": "facts"}, **options)
