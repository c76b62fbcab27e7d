"""Training and evaluating a chained head on bAbI: what ``pyro-multihop babi --encoding positions`` runs.

One learner for every task: :func:`babi_head` builds a :class:`~pyro_multihop.ChainedAttention` with the
age/offset gate terms (``max_distance = 2 * memory``, every position of the context), fitted by
:func:`~pyro_multihop.train.fit_svi` with :data:`BABI_SVI` (SVI on the exact enumerated ELBO, the hop latents
summed out, question-answer pairs only). The contexts are grouped by length (``group_lengths``): exact, since
padding has zero attention, and it saves most of the ``O(N^2)`` work on tasks whose stories are mostly short
(task 2: mean 31 of 100 positions; the step times with and without grouping are in
``benchmarks/results/length_groups.md``). :data:`BABI_EM_ITERATIONS` closed-form EM iterations fit the
content-only gate instead (``method="em"``). Both are defined in :mod:`pyro_multihop.experiments.command_defaults`
(torch-free, for the command's ``--help``) and re-exported here.

This module sits above :mod:`pyro_multihop.datasets` (which only reads and encodes the files) and
:mod:`pyro_multihop.train`: a training script, not a data module.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Callable, Optional

import torch

from ..checks import renamed_keyword
from ..datasets.babi import DEFAULT_MEMORY, BabiData, load_task
from ..models import ChainedAttention
from ..plots import facts_to_draw
from ..runs import CHECKPOINT_NAME, prepare_run_dir
from ..train import fit_svi
from .command_defaults import BABI_EM_ITERATIONS, BABI_SIGMA2, BABI_SVI
from .fit_findings import recorded_fit, report_findings

__all__ = ["BABI_SVI", "BABI_EM_ITERATIONS", "babi_head", "default_hops", "evaluate_babi", "plot_hop_posteriors", "run_babi"]


def babi_head(train: BabiData, n_hops: Optional[int] = None, sigma2: float = BABI_SIGMA2, seed: int = 0,
              positional: bool = True, *, hops: Optional[int] = None):
    """The chained head for a bAbI task: sizes from the vocabulary, age/offset terms over the whole memory.
    ``hops``: the old name of ``n_hops``, deprecated."""
    n_hops = renamed_keyword("babi_head", "n_hops", n_hops, "hops", hops)
    max_distance = 2 * train.encoder.memory if positional else None
    return ChainedAttention(
        n_hops, train.encoder.num_symbols, train.encoder.num_targets, sigma2=sigma2, seed=seed, max_distance=max_distance
    )


def default_hops(train: BabiData) -> int:
    """Hops a task needs: the most supporting facts of any training question (tasks 1, 2, 3: 1, 2, 3)."""
    return max(1, max(len(facts) for facts in train.supporting))


@torch.no_grad()
def evaluate_babi(head: ChainedAttention, data: BabiData) -> dict:
    """Answer accuracy (argmax of the predictive) and supporting-fact selection: the share of questions whose
    most probable hop path given the question, not the answer (``head.map_paths(obs, given_target=False)``,
    the path the model would follow at test time), lands on the supporting facts in order."""
    predicted = head.predict_proba(data.obs).argmax(-1)
    paths = head.map_paths(data.obs, given_target=False)
    return {
        "answer_accuracy": float((predicted == data.obs.target).double().mean()),
        "fact_accuracy": data.fact_accuracy(paths),
        "n_test": len(data),
        "log_likelihood": float(head.log_likelihood(data.obs).mean()),
    }


def plot_hop_posteriors(head: ChainedAttention, data: BabiData, rows, path=None, max_statements: int = 14,
                        title: Optional[str] = None):
    """Figure of the posterior hop marginals of some questions: statements as row labels, hops as columns,
    the supporting facts marked with ``*``, a colour bar of the posterior mass. A story of more than
    ``max_statements`` statements shows the ones that carry the mass (the top statements of each hop, the
    supporting ones and the MAP path's: :func:`~pyro_multihop.plots.facts_to_draw`), so that no hop attends
    outside the panel. Returns the matplotlib figure (saved to ``path`` if given)."""
    import matplotlib.pyplot as plt

    rows = list(rows)
    with torch.no_grad():
        hop_marginals = head.hop_marginals(data.obs[torch.tensor(rows)])
    figure, axes = plt.subplots(1, len(rows), figsize=(6.4 * len(rows) + 0.8, 0.32 * max_statements + 2.0),
                                squeeze=False)
    image = None
    for column, (ax, row) in enumerate(zip(axes[0], rows)):
        marginals = data.statement_marginals(hop_marginals, row, column)  # (M, L) over the row's statements
        context, facts = data.contexts[row], data.supporting[row] or ()
        supporting = [index for index, (story_id, _) in enumerate(context) if story_id in facts]
        drawn = facts_to_draw(marginals.t().numpy(), marginals.argmax(0).tolist(), supporting, len(context),
                              max_facts=max_statements)
        image = ax.imshow(marginals[drawn].numpy(), aspect="auto", cmap="Blues", vmin=0, vmax=1)
        labels = [f"{'*' if context[i][0] in facts else ' '}{context[i][0]}: {context[i][1]}" for i in drawn]
        ax.set_yticks(range(len(drawn)), labels, fontsize=7)
        ax.set_xticks(range(head.n_hops), [f"hop {hop + 1}" for hop in range(head.n_hops)])
        question = " ".join(data.questions[row].question)
        shown = "" if len(drawn) == len(context) else f"; {len(drawn)} of {len(context)} statements shown"
        ax.set_title(f"{question}? -> {data.questions[row].answer}\n(* supporting: {' '.join(map(str, facts))}"
                     f"{shown})", fontsize=8)
    figure.suptitle(title or f"posterior hop marginals of {len(rows)} test question(s), {head.n_hops} hop(s)", fontsize=10)
    figure.tight_layout()
    figure.colorbar(image, ax=list(axes[0]), label="posterior probability of the statement at the hop", shrink=0.9)
    if path is not None:
        figure.savefig(path, dpi=110, bbox_inches="tight")
    return figure


def run_babi(
    task: int,
    out,
    data_dir=None,
    train_dir=None,
    n_hops: Optional[int] = None,
    method: str = "svi",
    steps: Optional[int] = None,
    lr: Optional[float] = None,
    batch_size: Optional[int] = None,
    memory: int = DEFAULT_MEMORY,
    sigma2: float = BABI_SIGMA2,
    seed: int = 0,
    max_train: Optional[int] = None,
    figure_rows: int = 3,
    progress: bool = False,
    overwrite: bool = False,
    *,
    hops: Optional[int] = None,
    starts: int = 1,
    processes: Optional[int] = None,
    log: Optional[Callable[[str], None]] = None,
) -> dict:
    """Train on a task's training file, evaluate on its test file, write ``out/results.json``,
    ``out/hop_posteriors.png`` and ``out/checkpoint.pt`` (the fitted head, with the vocabulary); return the
    results. ``n_hops`` None: :func:`default_hops` (``hops``: its old name, deprecated). An ``out`` that holds a checkpoint is refused unless
    ``overwrite`` (:func:`~pyro_multihop.runs.prepare_run_dir`). The caller's random state is left alone.

    ``starts`` > 1 (SVI only): that many starts, the one with the best held-out log-likelihood on a tenth of
    the training questions kept, fitted in up to ``processes`` processes (``fit_svi(starts=K)``). An SVI run's
    results add ``diagnostics`` (the fit's findings, :mod:`~pyro_multihop.experiments.fit_findings`) and, with
    several starts, ``starts``; ``log`` takes them as notes, one line each (else they are warnings)."""
    if hops is not None:
        n_hops = renamed_keyword("run_babi", "n_hops", n_hops, "hops", hops)
    if method not in ("svi", "em"):
        raise ValueError(f"method must be 'svi' or 'em', got {method!r}")
    if method == "em" and starts != 1:
        raise ValueError(f"starts = {starts} (--starts): several starts are an SVI option; EM fits one start "
                         "(use method 'svi', or starts 1)")
    out = prepare_run_dir(out, overwrite=overwrite, resumable=False)
    train, test = load_task(task, data_dir=data_dir, train_dir=train_dir, memory=memory, max_train=max_train)
    n_hops = default_hops(train) if n_hops is None else n_hops
    started = time.perf_counter()
    findings = {}
    if method == "svi":
        head = babi_head(train, n_hops, sigma2=sigma2, seed=seed)
        settings = dict(BABI_SVI)
        settings.update({k: v for k, v in (("num_steps", steps), ("lr", lr)) if v is not None})
        fit = functools.partial(fit_svi, head, train.obs, batch_size=batch_size, seed=seed, progress=progress,
                                starts=starts, processes=processes, **settings)
        findings = report_findings(recorded_fit(fit, log)[1], log)
    else:
        # ChainedEM has no closed-form M-step for the age/offset logits: EM fits the content-only gate.
        from ..em import ChainedEM

        em = ChainedEM(n_hops, train.encoder.num_symbols, train.encoder.num_targets, sigma2=sigma2)
        head = em.fit(train.obs, max_iters=steps or BABI_EM_ITERATIONS, seed=seed).model
    seconds = time.perf_counter() - started
    results = {"task": task, "hops": n_hops, "method": method, **evaluate_babi(head, test)}
    results.update({"n_train": len(train), "train_seconds": round(seconds, 2), "positional": method == "svi",
                    **findings})
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from ..checkpoint import save_checkpoint

    vocabulary = {"symbols": list(train.encoder.symbols), "targets": list(train.encoder.answers)}
    save_checkpoint(out / CHECKPOINT_NAME, head, extra={"task": task, "memory": memory, "max_train": max_train,
                                                        "method": method, "vocabulary": vocabulary})
    import matplotlib.pyplot as plt

    figure = plot_hop_posteriors(head, test, range(min(figure_rows, len(test))), out / "hop_posteriors.png",
                                 title=f"bAbI task {task}, {n_hops} hop(s), {method.upper()}: posterior hop marginals "
                                 "of the first test questions")
    plt.close(figure)
    return results
