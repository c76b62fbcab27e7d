"""Training and evaluating a chained head on bAbI, and the ``pyro-multihop babi`` command.

One learner for every task: :func:`babi_head` builds a :class:`~pyro_multihop.ChainedAttention` with the
age/offset gate terms (``max_distance = 2 * memory``, every position of the context), fitted by
:func:`~pyro_multihop.train.fit_svi` with :data:`BABI_SVI` (SVI on the exact enumerated ELBO, the hop latents
summed out, question-answer pairs only). The contexts are grouped by length (``group_lengths``): exact, since
padding has zero attention, and it saves most of the ``O(N^2)`` work on tasks whose stories are mostly short
(task 2: mean 31 of 100 positions, 0.33 s against 7.9 s a step; ``benchmarks/results/length_groups.md``).

This module sits above :mod:`pyro_multihop.datasets` (which only reads and encodes the files) and
:mod:`pyro_multihop.train`: a training script, not a data module.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import torch

from ..datasets.babi import DEFAULT_DATA_DIR, DEFAULT_MEMORY, BabiData, load_task
from ..models import ChainedAttention
from ..runs import CHECKPOINT_NAME, prepare_run_dir
from ..train import fit_svi

__all__ = ["BABI_SVI", "babi_head", "default_hops", "evaluate_babi", "plot_hop_posteriors", "run_babi",
           "add_babi_parser", "babi_command"]

#: Keyword arguments of :func:`~pyro_multihop.train.fit_svi` for bAbI (measured on task 2, docs/babi.md):
#: full-batch steps, learning rate decaying tenfold, weight decay on the key tables (a stronger one than the
#: chained head's default: the compound symbols give the key tables many pair entries to memorise training
#: stories with), contexts grouped by length in steps of 10 positions.
BABI_SVI = {"num_steps": 200, "lr": 0.1, "lr_decay": 0.1, "weight_decay": {"key_tables": 1e-2}, "group_lengths": 10}


def babi_head(train: BabiData, hops: int, sigma2: float = 0.1, seed: int = 0, positional: bool = True):
    """The chained head for a bAbI task: sizes from the vocabulary, age/offset terms over the whole memory."""
    max_distance = 2 * train.encoder.memory if positional else None
    return ChainedAttention(
        hops, train.encoder.num_symbols, train.encoder.num_targets, sigma2=sigma2, seed=seed, max_distance=max_distance
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
    the supporting facts marked with ``*``, a colour bar of the posterior mass. Returns the matplotlib figure
    (saved to ``path`` if given)."""
    import matplotlib.pyplot as plt

    rows = list(rows)
    with torch.no_grad():
        hop_marginals = head.hop_marginals(data.obs[torch.tensor(rows)])
    figure, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows) + 0.8, 0.32 * max_statements + 2.0),
                                squeeze=False)
    image = None
    for column, (ax, row) in enumerate(zip(axes[0], rows)):
        marginals = data.statement_marginals(hop_marginals, column)  # (M, L) over the row's statements
        context = data.contexts[row][-max_statements:]
        marginals = marginals[-len(context):]
        image = ax.imshow(marginals.numpy(), aspect="auto", cmap="Blues", vmin=0, vmax=1)
        facts = data.supporting[row]
        labels = [f"{'*' if story_id in facts else ' '}{story_id}: {text}" for story_id, text in context]
        ax.set_yticks(range(len(context)), labels, fontsize=7)
        ax.set_xticks(range(head.n_hops), [f"hop {hop + 1}" for hop in range(head.n_hops)])
        question = " ".join(data.questions[row].question)
        ax.set_title(f"{question}? -> {data.questions[row].answer}\n(* supporting: {' '.join(map(str, facts))})", fontsize=8)
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
    hops: Optional[int] = None,
    method: str = "svi",
    steps: Optional[int] = None,
    lr: Optional[float] = None,
    batch_size: Optional[int] = None,
    memory: int = DEFAULT_MEMORY,
    sigma2: float = 0.1,
    seed: int = 0,
    max_train: Optional[int] = None,
    figure_rows: int = 3,
    progress: bool = False,
    overwrite: bool = False,
) -> dict:
    """Train on a task's training file, evaluate on its test file, write ``out/results.json``,
    ``out/hop_posteriors.png`` and ``out/checkpoint.pt`` (the fitted head, with the vocabulary); return the
    results. ``hops`` None: :func:`default_hops`. An ``out`` that holds a checkpoint is refused unless
    ``overwrite`` (:func:`~pyro_multihop.runs.prepare_run_dir`). The caller's random state is left alone."""
    if method not in ("svi", "em"):
        raise ValueError(f"method must be 'svi' or 'em', got {method!r}")
    out = prepare_run_dir(out, overwrite=overwrite, resumable=False)
    train, test = load_task(task, data_dir=data_dir, train_dir=train_dir, memory=memory, max_train=max_train)
    hops = default_hops(train) if hops is None else hops
    started = time.perf_counter()
    if method == "svi":
        head = babi_head(train, hops, sigma2=sigma2, seed=seed)
        settings = dict(BABI_SVI)
        settings.update({k: v for k, v in (("num_steps", steps), ("lr", lr)) if v is not None})
        fit_svi(head, train.obs, batch_size=batch_size, seed=seed, progress=progress, **settings)
    else:
        # ChainedEM has no closed-form M-step for the age/offset logits: EM fits the content-only gate.
        from ..em import ChainedEM

        em = ChainedEM(hops, train.encoder.num_symbols, train.encoder.num_targets, sigma2=sigma2)
        head = em.fit(train.obs, max_iters=steps or 50, seed=seed).model
    seconds = time.perf_counter() - started
    results = {"task": task, "hops": hops, "method": method, **evaluate_babi(head, test)}
    results.update({"n_train": len(train), "train_seconds": round(seconds, 2), "positional": method == "svi"})
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from ..checkpoint import save_checkpoint

    vocabulary = {"symbols": list(train.encoder.symbols), "targets": list(train.encoder.answers)}
    save_checkpoint(out / CHECKPOINT_NAME, head, extra={"task": task, "memory": memory, "max_train": max_train,
                                                        "method": method, "vocabulary": vocabulary})
    import matplotlib.pyplot as plt

    figure = plot_hop_posteriors(head, test, range(min(figure_rows, len(test))), out / "hop_posteriors.png",
                                 title=f"bAbI task {task}, {hops} hop(s), {method.upper()}: posterior hop marginals "
                                 "of the first test questions")
    plt.close(figure)
    return results


# -- the command ----------------------------------------------------------------------------------------------
def add_babi_parser(commands, positive_int=int, positive_float=float):
    """Register ``pyro-multihop babi`` on the command line's sub-parsers; returns its parser."""
    babi = commands.add_parser(
        "babi",
        help="train and evaluate on a bAbI task; write results.json and a hop-posterior figure",
        description="Train a chained head on a bAbI task's training file (question-answer pairs only), evaluate "
        "it on the task's test file and write OUT/results.json (answer_accuracy, fact_accuracy, n_test, task, "
        "hops, ...), OUT/checkpoint.pt and OUT/hop_posteriors.png (posterior hop marginals of the first test "
        "questions). Pick --hops per task: the number of supporting facts a question needs (task 1: 1, "
        "task 2: 2, task 3: 3), which is the default.",
    )
    babi.add_argument("--task", type=positive_int, required=True, help="bAbI task number (1-20)")
    babi.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                      help=f"directory with the qa*_train/test.txt files (default: the shipped {DEFAULT_DATA_DIR})")
    babi.add_argument("--train-dir", type=Path, default=None,
                      help="directory of the training file if not --data-dir (e.g. .../en-10k)")
    babi.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    babi.add_argument("--overwrite", action="store_true", help="replace the run in --out if it holds a checkpoint")
    babi.add_argument("--hops", type=positive_int, default=None,
                      help="number of hops L; pick it per task (task 1: 1, task 2: 2, task 3: 3) (default: the most "
                      "supporting facts of a training question, which is that number)")
    babi.add_argument("--method", choices=["svi", "em"], default="svi",
                      help="svi (with the age/offset gate terms) or em (closed-form EM, content-only gate) (default: svi)")
    babi.add_argument("--steps", type=positive_int, default=None,
                      help=f"SVI steps or EM iterations (default: {BABI_SVI['num_steps']} / 50)")
    babi.add_argument("--lr", type=positive_float, default=None, help=f"SVI learning rate (default: {BABI_SVI['lr']})")
    babi.add_argument("--batch-size", type=positive_int, default=None, help="questions per SVI step (default: all)")
    babi.add_argument("--memory", type=positive_int, default=DEFAULT_MEMORY,
                      help=f"statements kept before each question (default: {DEFAULT_MEMORY})")
    babi.add_argument("--max-train", type=positive_int, default=None, help="use only the first N training questions")
    babi.add_argument("--sigma2", type=positive_float, default=0.1, help="gate variance (default: 0.1)")
    babi.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    babi.add_argument("--no-progress", action="store_true", help="no progress display")
    return babi


def babi_command(args) -> int:
    """``pyro-multihop babi``: print the results as JSON."""
    results = run_babi(
        args.task, args.out, data_dir=args.data_dir, train_dir=args.train_dir, hops=args.hops, method=args.method,
        steps=args.steps, lr=args.lr, batch_size=args.batch_size, memory=args.memory, sigma2=args.sigma2,
        seed=args.seed, max_train=args.max_train, progress=not args.no_progress, overwrite=args.overwrite,
    )
    print(json.dumps(results))
    return 0
