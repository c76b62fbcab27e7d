"""Training and evaluating a chained head on bAbI, and the ``pyro-multihop babi`` command.

One learner for every task: :func:`babi_head` builds a :class:`~pyro_multihop.ChainedAttention` with the
age/offset gate terms (``max_distance = 2 * memory``, every position of the context), and :func:`fit_babi`
fits it by SVI on the exact enumerated ELBO (``TraceEnum_ELBO``, the hop latents summed out, question-answer
pairs only). ``fit_babi`` differs from :func:`~pyro_multihop.train.fit_svi` in one way: the contexts of a
batch are grouped by length and each group is cut to its own width before the loss, which is exact (padding
has zero attention) and saves most of the ``O(N^2)`` work on tasks whose stories are mostly short (task 2:
mean 31 of 100 positions). Optimiser, learning-rate decay and weight decay are ``fit_svi``'s, from
:func:`~pyro_multihop.train.svi_settings`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import pyro
import torch
from pyro.infer import TraceEnum_ELBO

from ..data import Observations
from ..engine.log_space import chain_map_paths
from ..models import ChainedAttention
from ..train import _make_optimizer, svi_settings
from .babi import DEFAULT_MEMORY, BabiData, load_task

__all__ = ["babi_head", "fit_babi", "evaluate_babi", "question_map_paths", "plot_hop_posteriors", "run_babi", "BABI_SVI"]

#: Settings of :func:`fit_babi` (measured on task 2, docs/babi.md): full-batch steps, ClippedAdam, learning
#: rate decaying tenfold, weight decay on the key tables (a stronger one than the chained head's default:
#: the compound symbols give the key tables many pair entries to memorise training stories with).
BABI_SVI = {"num_steps": 200, "lr": 0.1, "lr_decay": 0.1, "weight_decay": {"key_tables": 1e-2}}


def babi_head(train: BabiData, hops: int, sigma2: float = 0.1, seed: int = 0, positional: bool = True):
    """The chained head for a bAbI task: sizes from the vocabulary, age/offset terms over the whole memory."""
    max_distance = 2 * train.encoder.memory if positional else None
    return ChainedAttention(
        hops, train.encoder.num_symbols, train.encoder.num_targets, sigma2=sigma2, seed=seed, max_distance=max_distance
    )


def _trimmed(obs: Observations, width: int) -> Observations:
    return Observations(obs.keys[:, :width], obs.values[:, :width], obs.query, obs.target, obs.mask[:, :width])


class _LengthBuckets:
    """Rows grouped by context length (rounded up to ``granularity`` positions), each cut to its width."""

    def __init__(self, obs: Observations, granularity: int = 10):
        lengths = obs.mask.long().cumsum(-1).argmax(-1) + 1  # last real position + 1
        self.obs = obs
        self.width = ((lengths + granularity - 1) // granularity * granularity).clamp(max=obs.keys.shape[1])

    def batches(self, rows: torch.Tensor):
        widths = self.width[rows]
        for width in widths.unique().tolist():
            yield _trimmed(self.obs[rows[widths == width]], int(width))


def fit_babi(
    head: ChainedAttention,
    train: BabiData,
    *,
    num_steps: Optional[int] = None,
    lr: Optional[float] = None,
    batch_size: Optional[int] = None,
    seed: int = 0,
    log_every: int = 50,
    progress: bool = False,
) -> list:
    """Fit ``head`` to ``train`` by SVI on the exact enumerated ELBO, contexts grouped by length.

    :param batch_size: questions per step (None: all, full-batch); the loss is scaled to the whole set.
    :returns: ``[(step, loss per question), ...]`` every ``log_every`` steps (the training-batch loss).
    """
    settings = svi_settings(
        head,
        num_steps=num_steps or BABI_SVI["num_steps"],
        lr=lr or BABI_SVI["lr"],
        lr_decay=BABI_SVI["lr_decay"],
        weight_decay=BABI_SVI["weight_decay"],
    )
    obs = train.obs
    head.check_observations(obs)
    buckets = _LengthBuckets(obs)
    n = len(obs)
    elbo = TraceEnum_ELBO(max_plate_nesting=1)
    history = []
    generator = torch.Generator().manual_seed(seed)
    with pyro.get_param_store().scope():
        optimizer = _make_optimizer(head, settings)
        for step in range(1, settings["num_steps"] + 1):
            rows = torch.arange(n) if batch_size is None or batch_size >= n else torch.randperm(n, generator=generator)[:batch_size]
            optimizer.zero_grad()
            total = 0.0
            for batch in buckets.batches(rows):
                loss = elbo.differentiable_loss(head.model, head.guide, batch) / len(rows)
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            if step % log_every == 0 or step == settings["num_steps"]:
                history.append((step, total))
                if progress:
                    print(f"step {step}: loss {total:.4f}", flush=True)
    return history


@torch.no_grad()
def question_map_paths(head: ChainedAttention, obs: Observations) -> torch.Tensor:
    """``(n, L)`` the most probable hop path given the context and question, *not* the answer (Viterbi on the
    gate chain alone): the path the model would follow at test time."""
    chain = head.hop_chain(obs)
    return chain_map_paths(chain, torch.zeros_like(chain.init))


@torch.no_grad()
def evaluate_babi(head: ChainedAttention, data: BabiData) -> dict:
    """Answer accuracy (argmax of the predictive) and supporting-fact selection: the share of questions whose
    :func:`question_map_paths` lands on the supporting facts in order (:func:`~.babi.fact_matches`)."""
    predicted = head.predict_proba(data.obs).argmax(-1)
    paths = question_map_paths(head, data.obs)
    return {
        "answer_accuracy": float((predicted == data.obs.target).double().mean()),
        "fact_accuracy": data.fact_accuracy(paths),
        "n_test": len(data),
        "log_likelihood": float(head.log_likelihood(data.obs).mean()),
    }


def plot_hop_posteriors(head: ChainedAttention, data: BabiData, rows, path=None, max_statements: int = 14):
    """Figure of the posterior hop marginals of some questions: statements as row labels, hops as columns,
    the supporting facts marked. Returns the matplotlib figure (saved to ``path`` if given)."""
    import matplotlib.pyplot as plt

    rows = list(rows)
    with torch.no_grad():
        posterior = head.posterior(data.obs[torch.tensor(rows)])
    figure, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 0.32 * max_statements + 1.6), squeeze=False)
    for column, (ax, row) in enumerate(zip(axes[0], rows)):
        marginals = data.statement_marginals(posterior.hop_marginals, column)  # (M, L) over the row's statements
        context = data.contexts[row][-max_statements:]
        marginals = marginals[-len(context):]
        ax.imshow(marginals.numpy(), aspect="auto", cmap="Blues", vmin=0, vmax=1)
        facts = data.supporting[row]
        labels = [f"{'*' if story_id in facts else ' '}{story_id}: {text}" for story_id, text in context]
        ax.set_yticks(range(len(context)), labels, fontsize=7)
        ax.set_xticks(range(head.n_hops), [f"hop {hop + 1}" for hop in range(head.n_hops)])
        question = " ".join(data.questions[row].question)
        ax.set_title(f"{question}? -> {data.questions[row].answer}\n(* supporting: {' '.join(map(str, facts))})", fontsize=8)
    figure.tight_layout()
    if path is not None:
        figure.savefig(path, dpi=110)
    return figure


def run_babi(
    task: int,
    out,
    data_dir=None,
    train_dir=None,
    hops: int = 2,
    method: str = "svi",
    steps: Optional[int] = None,
    lr: Optional[float] = None,
    batch_size: Optional[int] = None,
    memory: int = DEFAULT_MEMORY,
    sigma2: float = 0.1,
    seed: int = 0,
    max_train: Optional[int] = None,
    figure_rows: int = 3,
) -> dict:
    """Train on a task's training file, evaluate on its test file, write ``out/results.json``,
    ``out/hop_posteriors.png`` and ``out/checkpoint.pt`` (the fitted head); return the results."""
    if method not in ("svi", "em"):
        raise ValueError(f"method must be 'svi' or 'em', got {method!r}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train, test = load_task(task, data_dir=data_dir, train_dir=train_dir, memory=memory, max_train=max_train)
    torch.manual_seed(seed)
    started = time.perf_counter()
    if method == "svi":
        head = babi_head(train, hops, sigma2=sigma2, seed=seed)
        fit_babi(head, train, num_steps=steps, lr=lr, batch_size=batch_size, seed=seed)
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

    save_checkpoint(out / "checkpoint.pt", head, extra={"task": task, "memory": memory, "max_train": max_train})
    import matplotlib.pyplot as plt

    figure = plot_hop_posteriors(head, test, range(min(figure_rows, len(test))), out / "hop_posteriors.png")
    plt.close(figure)
    return results


# -- the command ----------------------------------------------------------------------------------------------
def add_babi_parser(commands, positive_int=int, positive_float=float):
    """Register ``pyro-multihop babi`` on the command line's sub-parsers; returns its parser."""
    from .babi import DEFAULT_DATA_DIR

    babi = commands.add_parser(
        "babi",
        help="train and evaluate on a bAbI task; write results.json and a hop-posterior figure",
        description="Train a chained head on a bAbI task's training file (question-answer pairs only), evaluate "
        "it on the task's test file and write OUT/results.json (answer_accuracy, fact_accuracy, n_test, task, "
        "hops, ...) and OUT/hop_posteriors.png (posterior hop marginals of the first test questions).",
    )
    babi.add_argument("--task", type=positive_int, required=True, help="bAbI task number (1-20)")
    babi.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                      help=f"directory with the qa*_train/test.txt files (default: the shipped {DEFAULT_DATA_DIR})")
    babi.add_argument("--train-dir", type=Path, default=None,
                      help="directory of the training file if not --data-dir (e.g. .../en-10k)")
    babi.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    babi.add_argument("--hops", type=positive_int, default=2, help="number of hops L (default: 2)")
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
    return babi


def babi_command(args) -> int:
    """``pyro-multihop babi``: print the results as JSON."""
    results = run_babi(
        args.task, args.out, data_dir=args.data_dir, train_dir=args.train_dir, hops=args.hops, method=args.method,
        steps=args.steps, lr=args.lr, batch_size=args.batch_size, memory=args.memory, sigma2=args.sigma2,
        seed=args.seed, max_train=args.max_train,
    )
    print(json.dumps(results))
    return 0
