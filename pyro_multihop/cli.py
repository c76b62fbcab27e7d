"""The ``pyro-multihop`` command: simulate a task, train a head by SVI or EM, evaluate, predict, inspect.

::

    pyro-multihop simulate --task transitive -n 2000 --seed 0 --out train.csv
    pyro-multihop simulate --task transitive -n 2000 --seed 1 --out test.csv
    pyro-multihop train --data train.csv --val test.csv --model chained --method svi --out runs/svi
    pyro-multihop evaluate --checkpoint runs/svi/checkpoint.pt --data test.csv
    pyro-multihop predict --checkpoint runs/svi/checkpoint.pt --data test.csv --out predictions.csv
    pyro-multihop inspect --checkpoint runs/svi/checkpoint.pt --data test.csv --rows 0 1 2 --out runs/svi/figures
    pyro-multihop qa --train train.jsonl --test test.jsonl --hops 2 --out runs/qa
    pyro-multihop predict --checkpoint runs/qa/checkpoint.pt --data questions.jsonl --out answers.jsonl

Every subcommand has ``--help``. Bad files or arguments end with one line on stderr naming the problem
and exit status 2; nothing prints a traceback (set ``PYRO_MULTIHOP_DEBUG=1`` to get one).

``train`` runs data-parallel under ``torchrun`` (``torchrun --nproc-per-node 2 -m pyro_multihop train ...``):
each process reads its shard of ``--data`` and ``--val``, and rank 0 alone prints and writes the outputs
(see :mod:`pyro_multihop.distributed`).

``evaluate``, ``predict``, ``paths`` and ``inspect`` take a table checkpoint (``train``, ``babi --encoding
positions``) with table data (``.csv``, ``.parquet``), or a qa checkpoint (``qa``, ``babi``) with a facts file
(``.jsonl``); a pair that does not fit ends with one line saying what each takes.

This module parses arguments and prints; the work is done where it belongs:
:mod:`pyro_multihop.experiments.train_files` (``train``), :mod:`pyro_multihop.experiments.apply_commands`
(``evaluate``, ``predict``, ``inspect``, ``paths``), :mod:`pyro_multihop.experiments.chained_babi` and
:mod:`pyro_multihop.experiments.qa_command` (``babi``, ``qa``). The defaults the help shows come from
:mod:`pyro_multihop.experiments.command_defaults`, which imports nothing: no ``--help`` loads torch.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from .experiments import command_defaults as defaults
from .experiments.command_defaults import FACTS_SUFFIX, TABLE_SUFFIXES
from .experiments.qa_command import (add_comparison_argument, add_composition_argument, add_path_normalised_argument,
                                      add_qa_parser, add_starts_arguments, print_note)

__all__ = ["main"]

PROG = "pyro-multihop"
EXIT_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse, with errors as one line (``prog: error: message (see prog --help)``)."""

    def error(self, message):  # noqa: D401 - argparse API
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- argument types ----------------------------------------------------------------------------------------
def _number_parser(kind: type, description: str, accept: Callable[[float], bool]) -> Callable[[str], float]:
    """An argparse ``type``: parse ``text`` as ``kind`` and check it, with one-line errors."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {description}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {description}, got {text!r}")
        return value

    parse.__name__ = description.replace(" ", "_")
    return parse


_positive_int = _number_parser(int, "a positive integer", lambda value: value >= 1)
_nonnegative_int = _number_parser(int, "a non-negative integer", lambda value: value >= 0)
_positive_float = _number_parser(float, "a positive number", lambda value: math.isfinite(value) and value > 0)
_nonnegative_float = _number_parser(float, "a non-negative number", lambda value: math.isfinite(value) and value >= 0)
_fraction = _number_parser(float, "a number between 0 and 1", lambda value: 0 < value < 1)


def _data_path(text: str) -> Path:
    """Table data (``simulate``, ``train``)."""
    path = Path(text)
    if path.suffix not in TABLE_SUFFIXES:
        hint = " (a facts .jsonl file is trained by the qa command)" if path.suffix == FACTS_SUFFIX else ""
        raise argparse.ArgumentTypeError(f"data files end in .csv or .parquet, got {text!r}{hint}")
    return path


def _applied_data_path(text: str) -> Path:
    """Table data or a facts file (``evaluate``, ``predict``, ``paths``, ``inspect``)."""
    path = Path(text)
    if path.suffix not in TABLE_SUFFIXES + (FACTS_SUFFIX,):
        raise argparse.ArgumentTypeError(f"data files end in .csv or .parquet (table data, for a train checkpoint) "
                                         f"or .jsonl (a facts file, for a qa checkpoint), got {text!r}")
    return path


DEVICE_HELP = "torch device (default: cpu; a qa checkpoint: cpu only)"
CHECKPOINT_HELP = "a checkpoint written by train, qa or babi"
APPLIED_DATA_HELP = ("table data (.csv or .parquet) for a checkpoint of train or babi --encoding positions, or a "
                     "facts file (.jsonl, docs/qa.md) for a checkpoint of qa or babi")


#: Torch threads of each command when --threads is not given, from benchmarks/threads.py: on the library's
#: small tensors a second intra-op thread costs more in synchronisation than it computes (see docs/threads.md).
DEFAULT_THREADS = {"simulate": 1, "train": 1, "evaluate": 1, "predict": 1, "inspect": 1, "babi": 1, "paths": 1, "qa": 1}


def _add_threads(command: argparse.ArgumentParser, name: str) -> None:
    command.add_argument(
        "--threads", type=_nonnegative_int, default=DEFAULT_THREADS[name],
        help=f"torch intra-op threads; 0 keeps torch's default (one per core) (default: {DEFAULT_THREADS[name]}, "
        "the fastest on these small tensors: benchmarks/results/threads.md)",
    )


# -- the parser --------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Chained (multi-hop) attention heads: simulate tasks, train by SVI or EM, evaluate, "
        "predict, inspect, list hop paths, run bAbI.",
        epilog=f"Run '{PROG} COMMAND --help' for the options of a command.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details (INFO level)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    simulate = commands.add_parser(
        "simulate",
        help="simulate a task and write it to a data file",
        description="Simulate observations of a lookup task and write them to a .csv or .parquet file "
        "(columns query, target, key_0.., value_0..).",
    )
    simulate.add_argument("--task", choices=["transitive", "chain", "induction"], default="transitive",
                          help="transitive a->b->c (2 hops), chain (--hops hops) or induction (copy) (default: transitive)")
    simulate.add_argument("-n", "--n", type=_positive_int, default=2000, help="number of observations (default: 2000)")
    simulate.add_argument("--symbols", type=_positive_int, default=30, help="symbol vocabulary size S (default: 30)")
    simulate.add_argument("--pairs", type=_positive_int, default=5, help="pairs per hop block (transitive, chain; default: 5)")
    simulate.add_argument("--hops", type=_positive_int, default=2, help="hops of the chain task (default: 2)")
    simulate.add_argument("--seq-len", type=_positive_int, default=8, help="sequence length of the induction task (default: 8)")
    simulate.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    simulate.add_argument("--out", type=_data_path, required=True, help="output file, .csv or .parquet")

    train = commands.add_parser(
        "train",
        help="fit a head by SVI or EM; write checkpoint, metrics and figures",
        description="Fit a head to a data file. Writes OUT/checkpoint.pt (configuration, parameters, "
        "optimiser and training state), OUT/best.pt (SVI with held-out data: the parameters of the best held-out "
        "log-likelihood), OUT/metrics.csv (one row per logged step or EM iteration), OUT/loss.png, "
        "OUT/accuracy.png (with held-out data) and OUT/summary.json (with the fit's diagnostics and, with --starts, "
        "every start's record); each diagnostic is also printed as a warning line. An OUT that holds a checkpoint "
        "is refused unless --resume or --overwrite.",
    )
    _train_arguments(train)

    evaluate = commands.add_parser(
        "evaluate",
        help="scores of a checkpoint on table data or a facts file, as JSON",
        description="Evaluate a checkpoint on a data file; prints JSON (and writes it to --out if given). A train "
        "checkpoint on table data: mean log-likelihood per observation, accuracy of the most probable target, n. "
        "A qa checkpoint on a facts file (every line with its answer): the scores of the qa run's results.json "
        "(answer_accuracy, fact_accuracy, hop_fact_accuracy, n, log_likelihood) and answers_outside_facts.",
    )
    evaluate.add_argument("--checkpoint", type=Path, required=True, help=CHECKPOINT_HELP)
    evaluate.add_argument("--data", type=_applied_data_path, required=True, help=APPLIED_DATA_HELP)
    evaluate.add_argument("--device", default="cpu", help=DEVICE_HELP)
    evaluate.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")

    predict = commands.add_parser(
        "predict",
        help="answers or target probabilities, with the MAP hop paths",
        description="Predict with a checkpoint. Table data (a train checkpoint) gives a CSV, one row per "
        "observation: row, query, target (if the data has one), predicted (most probable target), p_predicted, "
        "p_target, map_hop_1..map_hop_L (context position attended at each hop on the most probable hop path: "
        "given the target when the data has one, else given the query only), and prob_0..prob_{T-1}. A facts "
        "file (a qa checkpoint; answers optional) gives JSON Lines, one line per question: id (the line's, else "
        "its place from 0), question, answer (the most probable), answer_prob, facts and fact_tokens (the fact "
        "of each hop on the most probable path given the question alone), and given_answer and correct where "
        "the line has an answer.",
    )
    predict.add_argument("--checkpoint", type=Path, required=True, help=CHECKPOINT_HELP)
    predict.add_argument("--data", type=_applied_data_path, required=True,
                         help=APPLIED_DATA_HELP + "; the target column, or a line's answer, is optional")
    predict.add_argument("--device", default="cpu", help=DEVICE_HELP)
    predict.add_argument("--out", type=Path, required=True, help="output file: .csv (table data) or .jsonl (facts)")

    inspect = commands.add_parser(
        "inspect",
        help="figures of a checkpoint: key tables, emission, hop marginals, embeddings",
        description="Draw a checkpoint into OUT. A train checkpoint: key_tables.png (chained), emission.png, "
        "embeddings.png (tied), and hop_marginals.png for --rows of --data. A qa checkpoint (needs --data, a "
        "facts file): hop_marginals.png, the hop marginals over the facts of --rows, given the answer where the "
        "line has one, else given the question alone.",
    )
    inspect.add_argument("--checkpoint", type=Path, required=True, help=CHECKPOINT_HELP)
    inspect.add_argument("--data", type=_applied_data_path, default=None,
                         help="data file for the hop marginals: " + APPLIED_DATA_HELP)
    inspect.add_argument("--rows", type=_nonnegative_int, nargs="+", default=[0, 1, 2],
                         help="rows (questions) of --data whose hop marginals to draw (default: 0 1 2)")
    inspect.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")

    babi = commands.add_parser(
        "babi",
        help="train and evaluate on a bAbI task; write results.json and a hop-posterior figure",
        description="Train the structured-facts head (--encoding facts, the default; docs/qa.md) or a chained head "
        "(--encoding positions) on a bAbI task's training file (question-answer pairs only), evaluate "
        "it on the task's test file and write OUT/results.json (answer_accuracy, fact_accuracy, n_test, task, "
        "hops, ...), OUT/checkpoint.pt (with the vocabulary) and OUT/hop_posteriors.png (posterior hop "
        "marginals of the first test questions); results.json also holds the fit's diagnostics (each printed as a "
        "warning line) and, with --starts, every start's record. Pick --hops per task: the number of supporting "
        "facts a question needs (task 1: 1, task 2: 2, task 3: 3), which is the default. An OUT that holds a "
        "checkpoint is refused unless --overwrite.",
    )
    _babi_arguments(babi)
    qa = add_qa_parser(commands, positive_int=_positive_int, positive_float=_positive_float, fraction=_fraction,
                       nonnegative_int=_nonnegative_int)

    paths = commands.add_parser(
        "paths",
        help="the k best hop paths of every row or question, with what each hop attends",
        description="Table data (a train checkpoint; targets needed): for each row the k most probable hop "
        "paths given the target (best first) with their posterior probabilities and the attended key:value "
        "(words when the checkpoint has a vocabulary) at each hop, the entropy of the path posterior in nats, "
        "and optionally paths drawn from the posterior; in chunks of --chunk rows, streamed to --out (.csv or "
        ".jsonl). A facts file (a qa checkpoint; answers optional): JSON Lines, per question its id, question "
        "and predicted answer, question_only (the k best paths given the question alone, each with prob, facts "
        "and fact_tokens, their entropy, and --samples drawn paths with their count) and, where the line has an "
        "answer, given_answer_paths, the same given the answer too.",
    )
    paths.add_argument("--checkpoint", type=Path, required=True, help=CHECKPOINT_HELP)
    paths.add_argument("--data", type=_applied_data_path, required=True, help=APPLIED_DATA_HELP)
    paths.add_argument("--out", type=Path, required=True, help="output file: .csv or .jsonl (facts: .jsonl)")
    paths.add_argument("-k", "--k", type=_positive_int, default=3, help="paths per row (default: 3)")
    paths.add_argument("--samples", type=_nonnegative_int, default=0,
                       help="also draw this many paths per row (default: 0)")
    paths.add_argument("--seed", type=int, default=0, help="seed of the drawn paths (default: 0)")
    paths.add_argument("--chunk", type=_positive_int, default=4096,
                       help="rows per chunk of table data (default: 4096; a facts file is chunked by the engine's "
                       "memory budget)")
    paths.add_argument("--device", default="cpu", help=DEVICE_HELP)
    paths.add_argument("--no-progress", action="store_true", help="no progress display")

    for name, command in (("simulate", simulate), ("evaluate", evaluate), ("predict", predict), ("inspect", inspect),
                          ("paths", paths), ("qa", qa)):
        _add_threads(command, name)
    return parser


def _train_arguments(train: argparse.ArgumentParser) -> None:
    """The arguments of ``train``, with the defaults of :mod:`pyro_multihop.experiments.command_defaults`."""
    sigma2_defaults = ", ".join(f"{defaults.TRAIN_SIGMA2[name]} {name}" for name in defaults.TRAIN_MODELS)
    train.add_argument("--data", type=_data_path, required=True, help="training data (.csv or .parquet)")
    train.add_argument("--val", "--valid", dest="val", type=_data_path, default=None,
                       help="held-out data, evaluated at every logged step; the best parameters go to OUT/best.pt")
    train.add_argument("--valid-fraction", type=_fraction, default=None,
                       help="instead of --val: hold out this share of --data (rows drawn by --seed)")
    train.add_argument("--patience", type=_positive_int, default=None,
                       help="SVI early stopping: stop after this many evaluations without a better held-out "
                       "log-likelihood (needs --val or --valid-fraction)")
    train.add_argument("--model", choices=list(defaults.TRAIN_MODELS), default=defaults.TRAIN_MODELS[0],
                       help="chained: one-hot key tables (exact); tied: latent tied embeddings (default: chained)")
    train.add_argument("--method", choices=["svi", "em"], default="svi",
                       help="svi: fit_svi on the enumerated ELBO; em: closed-form EM (chained) or variational "
                       "EM (tied) (default: svi)")
    train.add_argument("--hops", type=_positive_int, default=2, help="number of hops L (default: 2)")
    train.add_argument("--sigma2", type=_positive_float, default=None,
                       help=f"gate variance (attention temperature) (default: {sigma2_defaults})")
    train.add_argument("--embed-dim", type=_positive_int, default=8, help="embedding dimension of the tied model (default: 8)")
    train.add_argument("--symbols", type=_positive_int, default=None,
                       help="symbol vocabulary size S (default: the largest symbol in the data + 1)")
    train.add_argument("--targets", type=_positive_int, default=None,
                       help="number of targets T (default: the largest target in the data + 1, at least S)")
    train.add_argument("--steps", type=_positive_int, default=None,
                       help="SVI steps, or most EM iterations (default: the head's SVI defaults; "
                       f"{defaults.TRAIN_EM_ITERATIONS} EM iterations)")
    train.add_argument("--lr", type=_positive_float, default=None, help="SVI learning rate (default: the head's)")
    train.add_argument("--batch-size", type=_positive_int, default=None,
                       help="SVI mini-batch size (default: the head's; the chained head uses full batches)")
    add_starts_arguments(train, _positive_int)
    train.add_argument("--tol", type=_nonnegative_float, default=1e-6,
                       help="EM convergence threshold on the mean log-likelihood change (default: 1e-6)")
    train.add_argument("--seed", type=int, default=0, help="seed of the initialisation and of the run (default: 0)")
    train.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1 (default: cpu)")
    train.add_argument("--dtype", choices=["float32", "float64"], default="float32", help="parameter dtype (default: float32)")
    train.add_argument("--log-every", type=_positive_int, default=None, help="SVI steps between metric rows (default: 10)")
    train.add_argument("--checkpoint-every", type=_positive_int, default=None,
                       help="SVI steps between checkpoints (default: a tenth of the steps)")
    train.add_argument("--resume", action="store_true", help="continue an SVI run from OUT/checkpoint.pt if it exists")
    train.add_argument("--overwrite", action="store_true",
                       help="replace the run in OUT if it holds a checkpoint (without it, or --resume, OUT is refused)")
    train.add_argument("--jit", action="store_true", help="use JitTraceEnum_ELBO for the SVI loss")
    train.add_argument("--collapsed", action="store_true",
                       help="SVI on the collapsed model (hop path summed out by the engine; same loss, faster)")
    train.add_argument("--no-progress", action="store_true",
                       help="no progress display (a bar on a terminal, otherwise a line at each tenth of the steps and every 10 s)")
    train.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    _add_threads(train, "train")


def _babi_arguments(babi: argparse.ArgumentParser) -> None:
    """The arguments of ``babi``, with the defaults of :mod:`pyro_multihop.experiments.command_defaults`."""
    babi.add_argument("--task", type=_positive_int, required=True, help="bAbI task number (1-20)")
    babi.add_argument("--data-dir", type=Path, default=None,
                      help="directory with the qa*_train/test.txt files (default: the shipped en 1k files)")
    babi.add_argument("--train-dir", type=Path, default=None,
                      help="directory of the training file if not --data-dir (e.g. .../en-10k)")
    babi.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")
    babi.add_argument("--overwrite", action="store_true", help="replace the run in --out if it holds a checkpoint")
    babi.add_argument("--hops", type=_positive_int, default=None,
                      help="number of hops L; pick it per task (task 1: 1, task 2: 2, task 3: 3) (default: the most "
                      "supporting facts of a training question, which is that number)")
    babi.add_argument("--method", choices=["svi", "em"], default="svi",
                      help="svi (with the age/offset gate terms) or em (closed-form EM, content-only gate) (default: svi)")
    babi.add_argument("--steps", type=_positive_int, default=None,
                      help=f"SVI steps or EM iterations (default: {defaults.BABI_SVI['num_steps']} / "
                      f"{defaults.BABI_EM_ITERATIONS})")
    babi.add_argument("--lr", type=_positive_float, default=None,
                      help=f"SVI learning rate (default: {defaults.BABI_SVI['lr']})")
    babi.add_argument("--batch-size", type=_positive_int, default=None, help="questions per SVI step (default: all)")
    add_comparison_argument(babi)
    add_path_normalised_argument(babi)
    add_composition_argument(babi, _nonnegative_int)
    babi.add_argument("--memory", type=_positive_int, default=defaults.BABI_MEMORY,
                      help=f"statements kept before each question (default: {defaults.BABI_MEMORY})")
    babi.add_argument("--max-train", type=_positive_int, default=None, help="use only the first N training questions")
    add_starts_arguments(babi, _positive_int, facts=True)
    babi.add_argument("--sigma2", type=_positive_float, default=defaults.BABI_SIGMA2,
                      help=f"gate variance of the chained head (--encoding positions) (default: {defaults.BABI_SIGMA2})")
    babi.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    babi.add_argument("--no-progress", action="store_true", help="no progress display")
    babi.add_argument("--encoding", choices=["facts", "positions"], default="facts",
                      help="facts: every statement a fact of its tokens, the structured-facts head (SVI only); "
                      "positions: two (key, value) positions a statement, the chained head (default: facts)")
    _add_threads(babi, "babi")


# -- commands: each calls the module that does the work and prints what it returns ---------------------------
def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _simulate(args) -> int:
    from .data import chain_task, induction_task, transitive_task

    if args.task == "transitive":
        obs = transitive_task(args.n, num_symbols=args.symbols, pairs=args.pairs, seed=args.seed)
    elif args.task == "chain":
        obs = chain_task(args.n, n_hops=args.hops, num_symbols=args.symbols, pairs=args.pairs, seed=args.seed)
    else:
        obs = induction_task(args.n, num_symbols=args.symbols, seq_len=args.seq_len, seed=args.seed)
    if args.out.parent != Path("") and not args.out.parent.is_dir():
        args.out.parent.mkdir(parents=True, exist_ok=True)
    obs.save(args.out)
    print(f"wrote {len(obs)} observations of the {args.task} task (N = {obs.context_len} positions) to {args.out}")
    return 0


def _train(args) -> int:
    from .experiments.train_files import TrainFilesSettings, finish_training, start_training

    options = {field.name: getattr(args, field.name) for field in dataclasses.fields(TrainFilesSettings)}
    run = start_training(TrainFilesSettings(**options))
    with contextlib.ExitStack() as stack:
        if not run.is_main:  # under torchrun rank 0 alone prints (and writes)
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
        if run.resume_step is not None:
            print(f"resuming from step {run.resume_step} of {run.checkpoint}", flush=True)
        report = finish_training(run)
    for line in report.lines if report is not None else ():
        print(line)
    return 0


def _evaluate(args) -> int:
    from .experiments.apply_commands import evaluate_command
    from .experiments.command_files import write_json

    payload = evaluate_command(args.checkpoint, args.data, args.device, log=print_note)
    print(json.dumps(payload, indent=2))
    if args.out is not None:
        write_json(args.out, payload)
    return 0


def _predict(args) -> int:
    from .experiments.apply_commands import predict_command

    print(predict_command(args.checkpoint, args.data, args.out, args.device, log=print_note))
    return 0


def _inspect(args) -> int:
    from .experiments.apply_commands import inspect_command

    written = inspect_command(args.checkpoint, args.out, args.data, args.rows, log=print_note)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _paths(args) -> int:
    from .experiments.apply_commands import paths_command

    print(paths_command(args.checkpoint, args.data, args.out, k=args.k, samples=args.samples, seed=args.seed,
                        chunk=args.chunk, device=args.device, progress=not args.no_progress, log=print_note))
    return 0


def _babi(args) -> int:
    if args.encoding == "facts":
        from .experiments.qa_command import babi_facts_command

        return babi_facts_command(args)
    from .experiments.chained_babi import run_babi

    results = run_babi(
        args.task, args.out, data_dir=args.data_dir, train_dir=args.train_dir, n_hops=args.hops, method=args.method,
        steps=args.steps, lr=args.lr, batch_size=args.batch_size, memory=args.memory, sigma2=args.sigma2,
        seed=args.seed, max_train=args.max_train, progress=not args.no_progress, overwrite=args.overwrite,
        starts=args.starts or defaults.STARTS, processes=args.processes, log=print_note,
    )
    print(json.dumps(results))
    return 0


def _qa(args) -> int:
    from .experiments.qa_command import qa_command

    return qa_command(args)


def _set_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` for this process (0: leave torch's default)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


_COMMANDS = {"simulate": _simulate, "train": _train, "evaluate": _evaluate, "predict": _predict, "inspect": _inspect,
             "babi": _babi, "paths": _paths, "qa": _qa}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, or a usage error already printed as one line
        return int(exit_.code or 0)
    import matplotlib

    matplotlib.use("Agg")
    from . import distributed
    from .checkpoint import CheckpointError
    from .experiments.command_files import CommandError

    # Under torchrun only rank 0 logs below errors (the environment names the rank before the group exists).
    quiet = int(os.environ.get("RANK", 0)) != 0
    level = logging.ERROR if quiet else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format=f"{PROG}: %(message)s")
    _set_threads(args.threads)
    try:
        return _COMMANDS[args.command](args)
    except KeyboardInterrupt as interrupt:
        if hasattr(interrupt, "exit_status"):  # train.TrainingInterrupted: a checkpoint was written
            print(f"{PROG} {args.command}: interrupted by {signal.Signals(interrupt.signum).name} after step "
                  f"{interrupt.step}; checkpoint written to {interrupt.checkpoint} (continue with --resume)",
                  file=sys.stderr)
            return interrupt.exit_status
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except (CommandError, CheckpointError, ValueError, TypeError, OSError, ImportError, KeyError,
            distributed.PeerError) as error:
        if os.environ.get("PYRO_MULTIHOP_DEBUG"):
            raise
        # An error that every process raised together is printed once, by rank 0; any other by its rank.
        agreed, rank = distributed.agreed_error(error), distributed.rank()
        if rank == 0 or not agreed:
            where = f"rank {rank}: " if rank != 0 else ""
            print(f"{PROG} {args.command}: error: {where}{_first_line(error)}", file=sys.stderr, flush=True)
        if agreed:
            distributed.barrier()  # nobody exits (and has torchrun stop the others) before rank 0 printed
        return EXIT_ERROR
    finally:
        distributed.shutdown()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
