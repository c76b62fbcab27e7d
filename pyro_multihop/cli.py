"""The ``pyro-multihop`` command: simulate a task, train a head by SVI or EM, evaluate, predict, inspect.

::

    pyro-multihop simulate --task transitive -n 2000 --seed 0 --out train.csv
    pyro-multihop simulate --task transitive -n 2000 --seed 1 --out test.csv
    pyro-multihop train --data train.csv --val test.csv --model chained --method svi --out runs/svi
    pyro-multihop evaluate --checkpoint runs/svi/checkpoint.pt --data test.csv
    pyro-multihop predict --checkpoint runs/svi/checkpoint.pt --data test.csv --out predictions.csv
    pyro-multihop inspect --checkpoint runs/svi/checkpoint.pt --data test.csv --rows 0 1 2 --out runs/svi/figures

Every subcommand has ``--help``. Bad files or arguments end with one line on stderr naming the problem
and exit status 2; nothing prints a traceback (set ``PYRO_MULTIHOP_DEBUG=1`` to get one).

``train`` runs data-parallel under ``torchrun`` (``torchrun --nproc-per-node 2 -m pyro_multihop train ...``):
each process reads its shard of ``--data`` and ``--val``, and rank 0 alone prints and writes the outputs
(see :mod:`pyro_multihop.distributed`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["main"]

PROG = "pyro-multihop"
EXIT_ERROR = 2


class CommandError(Exception):
    """A problem with the user's files or arguments: printed as one line, exit status 2."""


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
    path = Path(text)
    if path.suffix not in (".csv", ".parquet"):
        raise argparse.ArgumentTypeError(f"data files end in .csv or .parquet, got {text!r}")
    return path


#: Torch threads of each command when --threads is not given, from benchmarks/threads.py: on the library's
#: small tensors a second intra-op thread costs more in synchronisation than it computes (see docs/threads.md).
DEFAULT_THREADS = {"simulate": 1, "train": 1, "evaluate": 1, "predict": 1, "inspect": 1, "babi": 1, "paths": 1, "qa": 1}

#: Defaults of ``babi`` shown in its --help without importing torch: ``experiments.babi.BABI_SVI`` and
#: ``datasets.babi.DEFAULT_MEMORY`` (tests/test_cli.py checks that they agree).
BABI_DEFAULTS = {"num_steps": 200, "lr": 0.1, "memory": 50}


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
        "OUT/accuracy.png (with held-out data) and OUT/summary.json. An OUT that holds a checkpoint is refused "
        "unless --resume or --overwrite.",
    )
    train.add_argument("--data", type=_data_path, required=True, help="training data (.csv or .parquet)")
    train.add_argument("--val", "--valid", dest="val", type=_data_path, default=None,
                       help="held-out data, evaluated at every logged step; the best parameters go to OUT/best.pt")
    train.add_argument("--valid-fraction", type=_fraction, default=None,
                       help="instead of --val: hold out this share of --data (rows drawn by --seed)")
    train.add_argument("--patience", type=_positive_int, default=None,
                       help="SVI early stopping: stop after this many evaluations without a better held-out "
                       "log-likelihood (needs --val or --valid-fraction)")
    train.add_argument("--model", choices=["chained", "tied"], default="chained",
                       help="chained: one-hot key tables (exact); tied: latent tied embeddings (default: chained)")
    train.add_argument("--method", choices=["svi", "em"], default="svi",
                       help="svi: fit_svi on the enumerated ELBO; em: closed-form EM (chained) or variational "
                       "EM (tied) (default: svi)")
    train.add_argument("--hops", type=_positive_int, default=2, help="number of hops L (default: 2)")
    train.add_argument("--sigma2", type=_positive_float, default=None,
                       help="gate variance (attention temperature) (default: 0.1 chained, 0.3 tied)")
    train.add_argument("--embed-dim", type=_positive_int, default=8, help="embedding dimension of the tied model (default: 8)")
    train.add_argument("--symbols", type=_positive_int, default=None,
                       help="symbol vocabulary size S (default: the largest symbol in the data + 1)")
    train.add_argument("--targets", type=_positive_int, default=None,
                       help="number of targets T (default: the largest target in the data + 1, at least S)")
    train.add_argument("--steps", type=_positive_int, default=None,
                       help="SVI steps, or most EM iterations (default: the head's SVI defaults; 100 EM iterations)")
    train.add_argument("--lr", type=_positive_float, default=None, help="SVI learning rate (default: the head's)")
    train.add_argument("--batch-size", type=_positive_int, default=None,
                       help="SVI mini-batch size (default: the head's; the chained head uses full batches)")
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

    evaluate = commands.add_parser(
        "evaluate",
        help="log-likelihood and accuracy of a checkpoint on data, as JSON",
        description="Evaluate a checkpoint on a data file: mean log-likelihood per observation, accuracy of "
        "the most probable target, and n. Prints JSON (and writes it to --out if given).",
    )
    evaluate.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint written by train")
    evaluate.add_argument("--data", type=_data_path, required=True, help="data file (.csv or .parquet)")
    evaluate.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    evaluate.add_argument("--out", type=Path, default=None, help="also write the JSON to this file")

    predict = commands.add_parser(
        "predict",
        help="CSV of target probabilities and MAP hop paths",
        description="Predict with a checkpoint. One CSV row per observation: row, query, target (if the data "
        "has one), predicted (most probable target), p_predicted, p_target, map_hop_1..map_hop_L (context "
        "position attended at each hop on the most probable hop path: given the target when the data has "
        "one, else given the query only), and prob_0..prob_{T-1}.",
    )
    predict.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint written by train")
    predict.add_argument("--data", type=_data_path, required=True,
                         help="data file (.csv or .parquet); the target column is optional")
    predict.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    predict.add_argument("--out", type=Path, required=True, help="output .csv file")

    inspect = commands.add_parser(
        "inspect",
        help="figures of a checkpoint: key tables, emission, hop marginals, embeddings",
        description="Draw a checkpoint's parameters into OUT: key_tables.png (chained), emission.png, "
        "embeddings.png (tied), and hop_marginals.png for --rows of --data.",
    )
    inspect.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint written by train")
    inspect.add_argument("--data", type=_data_path, default=None, help="data file for the hop marginals")
    inspect.add_argument("--rows", type=_nonnegative_int, nargs="+", default=[0, 1, 2],
                         help="rows of --data whose hop marginals to draw (default: 0 1 2)")
    inspect.add_argument("--out", type=Path, required=True, help="output folder (created if missing)")

    babi = commands.add_parser(
        "babi",
        help="train and evaluate on a bAbI task; write results.json and a hop-posterior figure",
        description="Train the structured-facts head (--encoding facts, the default; docs/qa.md) or a chained head "
        "(--encoding positions) on a bAbI task's training file (question-answer pairs only), evaluate "
        "it on the task's test file and write OUT/results.json (answer_accuracy, fact_accuracy, n_test, task, "
        "hops, ...), OUT/checkpoint.pt (with the vocabulary) and OUT/hop_posteriors.png (posterior hop "
        "marginals of the first test questions). Pick --hops per task: the number of supporting facts a "
        "question needs (task 1: 1, task 2: 2, task 3: 3), which is the default. An OUT that holds a "
        "checkpoint is refused unless --overwrite.",
    )
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
                      help=f"SVI steps or EM iterations (default: {BABI_DEFAULTS['num_steps']} / 50)")
    babi.add_argument("--lr", type=_positive_float, default=None,
                      help=f"SVI learning rate (default: {BABI_DEFAULTS['lr']})")
    babi.add_argument("--batch-size", type=_positive_int, default=None, help="questions per SVI step (default: all)")
    babi.add_argument("--memory", type=_positive_int, default=BABI_DEFAULTS["memory"],
                      help=f"statements kept before each question (default: {BABI_DEFAULTS['memory']})")
    babi.add_argument("--max-train", type=_positive_int, default=None, help="use only the first N training questions")
    babi.add_argument("--sigma2", type=_positive_float, default=0.1, help="gate variance (default: 0.1)")
    babi.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    babi.add_argument("--no-progress", action="store_true", help="no progress display")
    babi.add_argument("--encoding", choices=["facts", "positions"], default="facts",
                      help="facts: every statement a fact of its tokens, the structured-facts head (SVI only); "
                      "positions: two (key, value) positions a statement, the chained head (default: facts)")
    from .experiments.qa_command import add_qa_parser

    qa = add_qa_parser(commands, positive_int=_positive_int, positive_float=_positive_float,
                       fraction=_number_parser(float, "a number between 0 and 1", lambda value: 0 < value < 1))

    paths = commands.add_parser(
        "paths",
        help="CSV or JSON Lines of the k best hop paths of every row, with what each hop attends",
        description="For each row of a data file: the k most probable hop paths given the target (best first) "
        "with their posterior probabilities and the attended key:value (words when the checkpoint has a "
        "vocabulary) at each hop, the entropy of the path posterior in nats, and optionally paths drawn from "
        "the posterior. Runs in chunks of --chunk rows and streams to --out (.csv or .jsonl).",
    )
    paths.add_argument("--checkpoint", type=Path, required=True, help="a checkpoint written by train or babi")
    paths.add_argument("--data", type=_data_path, required=True, help="data file (.csv or .parquet) with targets")
    paths.add_argument("--out", type=Path, required=True, help="output file, .csv or .jsonl")
    paths.add_argument("-k", "--k", type=_positive_int, default=3, help="paths per row (default: 3)")
    paths.add_argument("--samples", type=_nonnegative_int, default=0,
                       help="also draw this many paths per row from the posterior (default: 0)")
    paths.add_argument("--seed", type=int, default=0, help="seed of the posterior samples (default: 0)")
    paths.add_argument("--chunk", type=_positive_int, default=4096, help="rows per chunk (default: 4096)")
    paths.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    paths.add_argument("--no-progress", action="store_true", help="no progress display")

    for name, command in (("simulate", simulate), ("train", train), ("evaluate", evaluate), ("predict", predict),
                          ("inspect", inspect), ("babi", babi), ("paths", paths), ("qa", qa)):
        _add_threads(command, name)
    return parser


# -- helpers -------------------------------------------------------------------------------------------------
def _device(text: str):
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CommandError(f"--device must be a torch device such as cpu or cuda:0, got {text!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandError(f"--device {text}: CUDA is not available on this machine")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise CommandError(f"--device {text}: only {torch.cuda.device_count()} CUDA device(s) present")
    return device


def _load_data(path: Path, shard: Optional[tuple] = None):
    """:meth:`Observations.load` of a data file (only rows of ``shard = (rank, world_size)`` if given); its
    errors name the file, row, line and cell."""
    from .data import Observations

    if not path.is_file():
        raise CommandError(f"data file {str(path)!r} does not exist")
    return Observations.load(path, shard)


def _load_context(path: Path):
    """``(Observations, has_target)`` of a data file whose target column is optional (0 where absent)."""
    from .data import Observations, read_columns

    if not path.is_file():
        raise CommandError(f"data file {str(path)!r} does not exist")
    has_target = "target" in read_columns(path)
    return Observations.load(path, allow_missing_target=True), has_target


def _load_checkpoint(path: Path, device):
    from .checkpoint import load_checkpoint

    model, state = load_checkpoint(path)
    return model.to(device), state


def _check_fits(model, obs, path: Path):
    try:
        model.check_observations(obs)
    except (ValueError, TypeError) as error:
        raise CommandError(f"data file {str(path)!r} does not fit the checkpoint's model: {error}"
                           f"{_vocabulary_hint(error)}") from None


def _vocabulary_hint(error: Exception) -> str:
    """A hint for data with symbols beyond a trained vocabulary: the vocabulary is fixed by training."""
    text = str(error)
    if "num_symbols" in text or "num_targets" in text:
        return ("; the vocabulary is fixed when a model is trained (by default the largest symbol of the training "
                "file + 1): retrain with train --symbols S (and --targets T) large enough for every file")
    return ""


def _vocabulary(state: dict) -> Optional[dict]:
    """The checkpoint's words ``{"symbols": [...], "targets": [...]}``, or None: from ``extra["vocabulary"]``
    (bAbI runs: symbols and targets), else from a checkpoint-level ``vocabulary`` (the symbols' words)."""
    vocabulary = (state.get("extra") or {}).get("vocabulary") or state.get("vocabulary")
    if isinstance(vocabulary, (list, tuple)):
        vocabulary = {"symbols": list(vocabulary), "targets": None}
    return vocabulary or None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")


def _json_default(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def _save_figure(figure, path: Path) -> Path:
    # bbox_inches="tight" keeps every label inside the PNG (colourbar ticks, long titles).
    figure.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    return path


def _run_dir(args, resumable: bool = True) -> Path:
    """``--out`` checked (:func:`~pyro_multihop.runs.prepare_run_dir`), as a CommandError."""
    from .runs import RunDirError, prepare_run_dir

    try:
        return prepare_run_dir(args.out, resume=getattr(args, "resume", False), overwrite=args.overwrite,
                               resumable=resumable, create=False)
    except RunDirError as error:
        raise CommandError(str(error)) from None


# -- commands ------------------------------------------------------------------------------------------------
def _simulate(args) -> int:
    from .data import chain_task, induction_task, transitive_task

    if args.task == "transitive":
        obs = transitive_task(args.n, num_symbols=args.symbols, pairs=args.pairs, seed=args.seed)
    elif args.task == "chain":
        obs = chain_task(args.n, hops=args.hops, num_symbols=args.symbols, pairs=args.pairs, seed=args.seed)
    else:
        obs = induction_task(args.n, num_symbols=args.symbols, seq_len=args.seq_len, seed=args.seed)
    if args.out.parent != Path("") and not args.out.parent.is_dir():
        args.out.parent.mkdir(parents=True, exist_ok=True)
    obs.save(args.out)
    print(f"wrote {len(obs)} observations of the {args.task} task (N = {obs.context_len} positions) to {args.out}")
    return 0


def _build_head(args, num_symbols: int, num_targets: int):
    if args.model == "chained":
        from .models.chained import ChainedAttention

        sigma2 = 0.1 if args.sigma2 is None else args.sigma2
        return ChainedAttention(args.hops, num_symbols, num_targets, sigma2, seed=args.seed)
    from .models.tied import TiedEmbeddingAttention

    sigma2 = 0.3 if args.sigma2 is None else args.sigma2
    return TiedEmbeddingAttention(num_symbols, args.embed_dim, num_targets, n_hops=args.hops, sigma2=sigma2, seed=args.seed)


def _check_method_options(args, device) -> None:
    """Options that do not apply to the method, before any process reads data (each would say so)."""
    import torch

    if args.val is not None and args.valid_fraction is not None:
        raise CommandError("give --val or --valid-fraction, not both")
    if args.patience is not None and args.val is None and args.valid_fraction is None:
        raise CommandError("--patience needs held-out data: --val FILE or --valid-fraction F")
    if args.method != "em":
        return
    svi_only = args.batch_size is not None or args.resume or args.jit or args.collapsed or args.patience is not None
    if args.model == "chained" and (svi_only or args.lr is not None):
        raise CommandError("--batch-size, --lr, --resume, --jit, --collapsed and --patience apply to --method svi only")
    if args.model == "tied" and svi_only:
        raise CommandError("--batch-size, --resume, --jit, --collapsed and --patience apply to --method svi only")
    if args.model == "tied" and (device.type != "cpu" or getattr(torch, args.dtype) != torch.get_default_dtype()):
        raise CommandError("--model tied --method em runs on the CPU in the default dtype only")


def _train(args) -> int:
    from . import distributed

    device = _device(args.device)
    _check_method_options(args, device)
    _run_dir(args)  # before anything is read or printed
    # Under torchrun: join the process group (nccl with one GPU per process, gloo on CPUs).
    if distributed.init_from_env(backend="nccl" if device.type == "cuda" else "gloo"):
        device = _device(str(distributed.local_device(device)))
    if distributed.rank() != 0:  # rank 0 alone prints and writes
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return _train_here(args, device)
    return _train_here(args, device)


def _train_here(args, device) -> int:
    import torch

    from . import distributed
    from .runs import BEST_CHECKPOINT_NAME, CHECKPOINT_NAME
    from .train import split_validation

    dtype = getattr(torch, args.dtype)
    shard = (distributed.rank(), distributed.world_size()) if distributed.is_distributed() else None
    with distributed.agreed():  # a bad row in one process's shard ends every process
        train_obs = _load_data(args.data, shard)
        val_obs = _load_data(args.val, shard) if args.val is not None else None
        if args.valid_fraction is not None:
            train_obs, val_obs = split_validation(train_obs, args.valid_fraction, seed=args.seed)
    both = [train_obs] + ([val_obs] if val_obs is not None else [])
    num_symbols = args.symbols or distributed.all_reduce_max(max(o.num_symbols for o in both))
    num_targets = args.targets or max(num_symbols, distributed.all_reduce_max(max(o.num_targets for o in both)))
    with distributed.agreed():
        for path, obs in ((args.data, train_obs), (args.val, val_obs)):
            if obs is not None:
                try:
                    obs.check_sizes(num_symbols, num_targets)
                except ValueError as error:
                    raise CommandError(f"data file {str(path)!r} does not fit --symbols/--targets: {error}") from None
        if distributed.rank() == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            if args.overwrite and (args.out / BEST_CHECKPOINT_NAME).exists():
                (args.out / BEST_CHECKPOINT_NAME).unlink()  # not this run's best
    checkpoint_path = args.out / CHECKPOINT_NAME
    started = time.perf_counter()
    notes, best = [], None
    if args.method == "svi":
        model, metrics, settings, notes, best = _train_svi(args, num_symbols, num_targets, train_obs, val_obs,
                                                           device, dtype, checkpoint_path)
    else:
        from .em.runs import run_chained_em, run_variational_em

        options = dict(hops=args.hops, num_symbols=num_symbols, num_targets=num_targets, seed=args.seed,
                       checkpoint=checkpoint_path)
        if args.model == "chained":
            run = run_chained_em(train_obs, val_obs, sigma2=0.1 if args.sigma2 is None else args.sigma2,
                                 max_iters=args.steps or 100, tol=args.tol, dtype=dtype, device=device, **options)
        else:
            run = run_variational_em(train_obs, val_obs, embed_dim=args.embed_dim, max_iters=args.steps, lr=args.lr,
                                     sigma2=0.3 if args.sigma2 is None else args.sigma2, **options)
        model, metrics, settings, notes = run
    seconds = time.perf_counter() - started
    train_result = distributed.evaluate(model, train_obs.to(device))
    val_result = None if val_obs is None else distributed.evaluate(model, val_obs.to(device))
    if distributed.rank() != 0:
        return 0
    for note in notes:
        print(note)
    figures = _training_outputs(args, metrics, len(train_obs), val_obs)
    summary = {
        "model": type(model).__name__,
        "method": args.method,
        "config": model.config(),
        "settings": settings,
        "seconds": seconds,
        "processes": distributed.world_size(),
        "train": train_result,
        "val": val_result,
        "checkpoint": str(checkpoint_path),
        "best": best,
        "metrics": str(args.out / "metrics.csv"),
        "figures": [str(f) for f in figures],
    }
    _write_json(args.out / "summary.json", summary)
    print(f"{args.model}/{args.method}: {seconds:.1f} s; train log-likelihood {train_result['log_likelihood']:.4f}, "
          f"accuracy {train_result['accuracy']:.4f}")
    if val_result is not None:
        print(f"held-out log-likelihood {val_result['log_likelihood']:.4f}, accuracy {val_result['accuracy']:.4f} "
              "(last parameters)")
    if best is not None:
        print(f"best checkpoint: {args.out / BEST_CHECKPOINT_NAME} (step {best['step']}: highest held-out "
              f"log-likelihood, {best['log_likelihood']:.4f}{'; stopped early' if best['stopped_early'] else ''})")
    written = [checkpoint_path] + ([args.out / BEST_CHECKPOINT_NAME] if best is not None else [])
    written += [args.out / "metrics.csv", *figures, args.out / "summary.json"]
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _training_outputs(args, metrics, n_train: int, val_obs) -> list:
    """metrics.csv, loss.png and (with held-out data) accuracy.png; returns the figures' paths."""
    from .plots import plot_training_curves

    metrics.to_csv(args.out / "metrics.csv", index=False)
    title, x_label = _training_title(args, n_train, val_obs)
    figures = [_save_figure(plot_training_curves(metrics, which="loss", title=title, x_label=x_label),
                            args.out / "loss.png")]
    if "val_accuracy" in metrics.columns:
        figures.append(_save_figure(plot_training_curves(metrics, which="accuracy", title=title, x_label=x_label),
                                    args.out / "accuracy.png"))
    return figures


def _training_title(args, n_train: int, val_obs) -> tuple:
    """Title (head, method, data) and x-axis label of the training figures."""
    method = {"svi": "SVI", "em": "EM" if args.model == "chained" else "variational EM"}[args.method]
    title = f"{args.model} head, {method} on {args.data.name} ({n_train} rows)"
    if args.val is not None:
        title += f"; held-out {args.val.name} ({len(val_obs)} rows)"
    elif val_obs is not None:
        title += f"; held-out {len(val_obs)} rows of it"
    return title, "step" if args.method == "svi" else f"{method} iteration"


def _check_resume(args, model, checkpoint_path: Path) -> Optional[int]:
    """The step of the checkpoint to resume, after checking that it holds this command's model; None
    without --resume or a checkpoint."""
    from .checkpoint import read_checkpoint

    if not (args.resume and checkpoint_path.is_file()):
        return None
    state = read_checkpoint(checkpoint_path)
    config = dict(model.config())
    if state["model_class"] != type(model).__name__ or dict(state["config"]) != config:
        saved = dict(state["config"])
        differ = sorted(k for k in set(saved) | set(config) if saved.get(k) != config.get(k))
        what = ", ".join(f"{k} = {saved.get(k)!r} there, {config.get(k)!r} here" for k in differ)
        raise CommandError(f"--resume: {checkpoint_path} holds a {state['model_class']} of another configuration "
                           f"({what or 'another class'}); give the options it was trained with, or --overwrite")
    return int(state["step"])


def _train_svi(args, num_symbols, num_targets, train_obs, val_obs, device, dtype, checkpoint_path):
    """``(model, metrics, settings, notes, best)`` of an SVI run; the OverfittingWarning becomes a note."""
    from .train import OverfittingWarning

    model = _build_head(args, num_symbols, num_targets).to(device=device, dtype=dtype)
    step = _check_resume(args, model, checkpoint_path)
    if step is not None:
        print(f"resuming from step {step} of {checkpoint_path}", flush=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", OverfittingWarning)
        metrics = _fit(model, train_obs, val_obs, args, checkpoint_path)
    notes = [f"warning: {w.message}" for w in caught if issubclass(w.category, OverfittingWarning)]
    for other in caught:
        if not issubclass(other.category, OverfittingWarning):
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    if metrics.attrs["divergences"]:
        notes.append(f"note: {len(metrics.attrs['divergences'])} divergence(s) caught; best parameters restored each time")
    return model, metrics, metrics.attrs["settings"], notes, metrics.attrs.get("best_val")


def _fit(model, train_obs, val_obs, args, checkpoint_path):
    from .train import fit_svi

    return fit_svi(
        model,
        train_obs,
        num_steps=args.steps,
        lr=args.lr,
        batch_size=args.batch_size,
        val=val_obs,
        patience=args.patience,
        seed=args.seed,
        progress=not args.no_progress,
        jit=args.jit,
        collapsed=args.collapsed,
        log_every=args.log_every,
        checkpoint=checkpoint_path,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
    )


def _evaluate(args) -> int:
    import torch

    device = _device(args.device)
    model, _ = _load_checkpoint(args.checkpoint, device)
    obs = _load_data(args.data)
    _check_fits(model, obs, args.data)
    with torch.no_grad():
        result = model.evaluate(obs.to(device))
    payload = {"checkpoint": str(args.checkpoint), "data": str(args.data), "model": type(model).__name__, **result}
    text = json.dumps(payload, indent=2)
    print(text)
    if args.out is not None:
        _write_json(args.out, payload)
    return 0


def _predict(args) -> int:
    import pandas as pd
    import torch

    if args.out.suffix != ".csv":
        raise CommandError(f"--out must end in .csv, got {str(args.out)!r}")
    device = _device(args.device)
    model, _ = _load_checkpoint(args.checkpoint, device)
    obs, has_target = _load_context(args.data)
    _check_fits(model, obs, args.data)
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(columns).to_csv(args.out, index=False)
    print(f"wrote predictions for {len(obs)} observations to {args.out}")
    return 0


def _inspect(args) -> int:
    import torch

    from .em.runs import training_method
    from .plots import plot_embeddings, plot_emission, plot_hop_marginals, plot_key_tables

    model, state = _load_checkpoint(args.checkpoint, torch.device("cpu"))
    vocabulary = _vocabulary(state) or {}
    words = {"symbols": vocabulary.get("symbols"), "targets": vocabulary.get("targets")}
    obs = None
    if args.data is not None:
        obs = _load_data(args.data)
        _check_fits(model, obs, args.data)
        bad = [r for r in args.rows if r >= len(obs)]
        if bad:
            raise CommandError(f"--rows must be below the {len(obs)} observations of {str(args.data)!r}, got {bad}")
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{type(model).__name__} ({training_method(state)}, {args.checkpoint})"
    written = []
    if isinstance(getattr(model, "key_tables", None), torch.Tensor):
        figure = plot_key_tables(model, title=f"{name}: key tables", symbols=words["symbols"])
        written.append(_save_figure(figure, args.out / "key_tables.png"))
    if callable(getattr(model, "embeddings", None)):
        figure = plot_embeddings(model, title=f"{name}: embeddings", symbols=words["symbols"])
        written.append(_save_figure(figure, args.out / "embeddings.png"))
    figure = plot_emission(model, title=f"{name}:\nemission p(target | value)", **words)
    written.append(_save_figure(figure, args.out / "emission.png"))
    if obs is not None:
        figure = plot_hop_marginals(model, obs, rows=args.rows, title=f"{name}: posterior hop marginals of "
                                    f"{args.data.name}", **words)
        written.append(_save_figure(figure, args.out / "hop_marginals.png"))
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _paths(args) -> int:
    from .paths import PATH_FORMATS, write_paths

    if args.out.suffix not in PATH_FORMATS:
        raise CommandError(f"--out must end in {' or '.join(PATH_FORMATS)}, got {str(args.out)!r}")
    device = _device(args.device)
    model, state = _load_checkpoint(args.checkpoint, device)
    obs = _load_data(args.data)
    _check_fits(model, obs, args.data)
    rows = write_paths(model, obs, args.out, k=args.k, num_samples=args.samples, seed=args.seed,
                       chunk_size=args.chunk, vocabulary=_vocabulary(state), progress=not args.no_progress)
    print(f"wrote the {args.k} best paths of {rows} rows to {args.out}")
    return 0


def _babi(args) -> int:
    if args.encoding == "facts":
        from .experiments.qa_command import babi_facts_command

        return babi_facts_command(args)
    from .experiments.babi import run_babi

    _run_dir(args, resumable=False)
    results = run_babi(
        args.task, args.out, data_dir=args.data_dir, train_dir=args.train_dir, hops=args.hops, method=args.method,
        steps=args.steps, lr=args.lr, batch_size=args.batch_size, memory=args.memory, sigma2=args.sigma2,
        seed=args.seed, max_train=args.max_train, progress=not args.no_progress, overwrite=args.overwrite,
    )
    print(json.dumps(results))
    return 0


def _set_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)`` for this process (0: leave torch's default)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


def _qa(args) -> int:
    from .experiments.qa_command import qa_command

    return qa_command(args)


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
