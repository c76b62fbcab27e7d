"""The ``pyro-multihop qa`` command's options (imported when the command line is built: no torch here)
and its entry point, which runs :func:`pyro_multihop.experiments.qa.run_qa`; and ``pyro-multihop babi
--encoding facts`` (the default), which runs :func:`pyro_multihop.experiments.qa.run_babi_facts`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import command_defaults

__all__ = ["add_qa_parser", "add_comparison_argument", "add_composition_argument", "add_path_normalised_argument",
           "add_starts_arguments", "qa_command", "babi_facts_command", "print_note"]


def print_note(line: str) -> None:
    """A note of a run (the step it resumes from, answers that no fact holds, the starts kept, each diagnostic as
    ``warning: <message> (try: <hint>)``): one line on standard error, so that standard output keeps only the
    results."""
    print(f"pyro-multihop: {line}", file=sys.stderr, flush=True)


def add_qa_parser(commands, positive_int=int, positive_float=float, fraction=float, nonnegative_int=int):
    """Register ``pyro-multihop qa`` on the command line's sub-parsers (the argument types are the command
    line's checked parsers); returns its parser."""
    qa = commands.add_parser(
        "qa",
        help="train the structured-facts head on a QA JSON Lines file; evaluate, predict, draw",
        description="Train the structured-facts head on TRAIN.jsonl (one question a line: facts, question, answer, "
        "optional supporting; docs/qa.md), from answers alone, and evaluate it on TEST.jsonl. Writes "
        "OUT/results.json (with the fit's and the hops' diagnostics, each also printed as a warning line, and with "
        "--starts every start's record), OUT/predictions.jsonl, OUT/hop_posteriors.png and OUT/checkpoint.pt (with "
        "the vocabulary).",
    )
    qa.add_argument("--train", type=Path, required=True, help="training questions (.jsonl); the vocabulary comes from it")
    qa.add_argument("--test", type=Path, required=True, help="test questions (.jsonl)")
    qa.add_argument("--hops", type=positive_int, required=True, help="number of hops L")
    qa.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    qa.add_argument("--seed", type=int, default=0, help="seed of the initialisation and of the run (default: 0)")
    qa.add_argument("--embed-dim", type=positive_int, nargs="?", default=None, const=command_defaults.EMBED_DIM,
                    metavar="D", help="symbol embeddings of D dimensions in place of the S x S tables: memory O(S D), "
                    f"for large vocabularies (--embed-dim alone: D = {command_defaults.EMBED_DIM}; without it: the "
                    "tables)")
    qa.add_argument("--embed-min-count", type=positive_int, default=None, metavar="K",
                    help="with --embed-dim: only the symbols of at least K training questions own an embedding; the "
                    "others (entities seen once or twice) enter through equality and the copy alone, as unseen "
                    f"ones do (default: {command_defaults.EMBED_MIN_COUNT}; 1: every symbol; docs/facts.md)")
    add_comparison_argument(qa)
    add_path_normalised_argument(qa)
    add_composition_argument(qa, nonnegative_int)
    qa.add_argument("--collapsed", action="store_true", help="SVI on the collapsed model (same loss, faster)")
    qa.add_argument("--steps", type=positive_int, default=None, help="SVI steps (default: the head's)")
    qa.add_argument("--lr", type=positive_float, default=None, help="SVI learning rate (default: the head's)")
    qa.add_argument("--batch-size", type=positive_int, default=None, help="questions per SVI step (default: the head's)")
    qa.add_argument("--valid-fraction", type=fraction, default=None,
                    help="hold out this share of the training questions to watch the held-out log-likelihood")
    add_starts_arguments(qa, positive_int, facts=True)
    qa.add_argument("--figure-rows", type=positive_int, default=3, help="test questions drawn in the figure (default: 3)")
    qa.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    qa.add_argument("--overwrite", action="store_true", help="replace the run in --out if it holds a checkpoint")
    qa.add_argument("--no-progress", action="store_true", help="no progress display")
    return qa


def add_comparison_argument(command) -> None:
    """``--comparison`` / ``--no-comparison`` of ``qa`` and ``babi`` (the facts head's emission comparison)."""
    command.add_argument("--comparison", action=argparse.BooleanOptionalAction, default=None,
                         help="yes / no / maybe answers from comparisons of question tokens with the attended fact's "
                         "fields (the emission's comparison component); default: on where some training answer "
                         "occurs in no fact of its question, with starts without it (--starts), the one with the "
                         "best held-out log-likelihood kept")


def add_path_normalised_argument(command) -> None:
    """``--path-normalised`` / ``--no-path-normalised`` of ``qa`` and ``babi`` (``FactAttention(path_normalised=...)``)."""
    command.add_argument("--path-normalised", action=argparse.BooleanOptionalAction, default=None,
                         help="one softmax over whole hop paths (a CRF over the hops) in place of one per hop; "
                         "default: on where the answer is said per hop (every training answer has one "
                         "comma-separated part per hop)")


def add_composition_argument(command, nonnegative_int=int) -> None:
    """``--composition D`` of ``qa`` and ``babi`` (``FactAttention(composition=D)``; 0: off)."""
    command.add_argument("--composition", type=nonnegative_int, default=None, metavar="D",
                         help="mix a composition of two facts into the emission (a yes / no from what two facts "
                         "state together, relation vectors of D dimensions; 0: off); default: "
                         f"{command_defaults.COMPOSITION_DIM} where some training answers occur in no fact and are "
                         "neither lists nor said per hop, with four more starts (the composition alone from three draws "
                         "of its vectors, the head without it), else off (docs/facts.md, \"A composition of two facts\")")


def add_starts_arguments(command, positive_int=int, facts: bool = False) -> None:
    """``--starts`` and ``--processes`` (SVI's several starts, ``fit_svi(starts=K, processes=P)``) on ``command``:
    ``qa``, ``babi`` and ``train`` take them alike; ``facts``: the default is the facts head's (None: 8 where its
    comparison is on, else 1; 4 more where its composition is on: ``run_qa``)."""
    starts = command_defaults.STARTS
    default = (f"{command_defaults.COMPARISON_STARTS} where the comparison is on (with and without it, from the "
               f"equality weights at 1 and at 0, with and without the word-order terms), else {starts}; 4 more where the "
               "composition is on" if facts
               else f"{starts}, one plain fit")
    command.add_argument("--starts", type=positive_int, default=None if facts else starts,
                         help="fit this many SVI starts (start 0 the plain fit, the others perturbed or the head's "
                         "own) and keep the one with the best held-out log-likelihood (on the held-out data given, "
                         "--val or --valid-fraction, else a tenth of the training data); every start is recorded in "
                         f"the results; SVI only (default: {default}; docs/svi.md)")
    command.add_argument("--processes", type=positive_int, default=None,
                         help="with --starts: processes that fit starts at once (default: one per start up to the "
                         "usable cores; 1 on a GPU)")


def qa_command(args) -> int:
    """``pyro-multihop qa``: both files are read in full (any bad line stops here), then
    :func:`~pyro_multihop.experiments.qa.run_qa`; prints its notes (:func:`print_note`) and the results as JSON."""
    from ..datasets.qa_jsonl import read_qa_jsonl
    from ..runs import prepare_run_dir
    from .qa import run_qa

    prepare_run_dir(args.out, resume=args.resume, overwrite=args.overwrite, create=False)
    train, test = read_qa_jsonl(args.train), read_qa_jsonl(args.test)
    results = run_qa(train, test, args.hops, args.out, seed=args.seed, steps=args.steps, lr=args.lr,
                     batch_size=args.batch_size, valid_fraction=args.valid_fraction, collapsed=args.collapsed,
                     resume=args.resume, overwrite=args.overwrite, figure_rows=args.figure_rows,
                     progress=not args.no_progress, log=print_note, embed_dim=args.embed_dim,
                     embed_min_count=args.embed_min_count, comparison=args.comparison, starts=args.starts,
                     processes=args.processes, path_normalised=args.path_normalised, composition=args.composition)
    print(json.dumps(results))
    return 0


def babi_facts_command(args) -> int:
    """``pyro-multihop babi`` with ``--encoding facts``: the task's stories as facts, the structured-facts head
    by SVI (:func:`~pyro_multihop.experiments.qa.run_babi_facts`); prints the results as JSON."""
    from ..runs import prepare_run_dir
    from .qa import run_babi_facts

    if args.method != "svi":
        raise ValueError(f"--method {args.method}: the structured-facts head is trained by SVI only (its attention "
                         "normaliser has no closed-form M-step); use --encoding positions for EM")
    prepare_run_dir(args.out, overwrite=args.overwrite, resumable=False, create=False)
    results = run_babi_facts(args.task, args.out, data_dir=args.data_dir, train_dir=args.train_dir, n_hops=args.hops,
                             memory=args.memory, max_train=args.max_train, seed=args.seed, steps=args.steps, lr=args.lr,
                             batch_size=args.batch_size, overwrite=args.overwrite, progress=not args.no_progress,
                             log=print_note, starts=args.starts, processes=args.processes, comparison=args.comparison,
                             path_normalised=args.path_normalised, composition=args.composition)
    print(json.dumps(results))
    return 0
