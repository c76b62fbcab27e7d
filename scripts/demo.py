"""``make demo``: the transitive task end to end with the ``pyro-multihop`` command.

1. simulate a training set and a held-out set of the transitive task (a -> b -> c, 30 symbols, 5 pairs);
2. train the 2-hop chained head by SVI (``fit_svi`` with the library's defaults) and by closed-form EM;
3. evaluate both on the held-out set (JSON), predict (CSV) and draw their parameters (PNG);
4. compare them with the generating structure (identity key tables and emission): ``comparison.csv``,
   ``comparison.json`` and ``comparison.png``.

Everything goes under ``--out`` (default ``demo_output``), which is printed at the end; a rerun replaces the
previous runs there (``train --overwrite``). A few minutes on
two CPU cores; ``--smoke`` runs it at a tiny size in seconds (the test suite does).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator

from pyro_multihop import ChainedAttention, Observations
from pyro_multihop.cli import main as cli


def run(argv: list) -> None:
    print("$ pyro-multihop " + " ".join(argv), flush=True)
    code = cli(argv)
    if code != 0:
        raise SystemExit(f"demo: pyro-multihop {argv[0]} failed with exit status {code}")


def comparison_figure(runs: dict, truth_loss: float, truth_accuracy: float, data: str) -> Figure:
    figure = Figure(figsize=(11, 4), layout="constrained")
    loss_axis, accuracy_axis = figure.subplots(1, 2)
    for name, metrics in runs.items():
        loss_axis.plot(metrics["seconds"], -metrics["val_log_likelihood"], label=name)
        accuracy_axis.plot(metrics["seconds"], metrics["val_accuracy"], label=name)
    loss_axis.axhline(truth_loss, color="k", linestyle="--", linewidth=1, label="generating structure")
    accuracy_axis.axhline(truth_accuracy, color="k", linestyle="--", linewidth=1, label="generating structure")
    loss_axis.set_yscale("log")
    loss_axis.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 3.0, 5.0)))
    loss_axis.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    loss_axis.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    loss_axis.set_xlabel("training time (s)")
    loss_axis.set_ylabel("held-out negative log-likelihood per observation")
    accuracy_axis.set_xlabel("training time (s)")
    accuracy_axis.set_ylabel("held-out accuracy")
    accuracy_axis.set_ylim(0, 1)
    for axis in (loss_axis, accuracy_axis):
        axis.grid(True, alpha=0.3)
        axis.legend(loc="best")
    figure.suptitle(f"2-hop chained head, SVI and EM, on {data}")
    return figure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo_output"), help="output folder (default: demo_output)")
    parser.add_argument("--n-train", type=int, default=2000)
    parser.add_argument("--n-test", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (default 1: the tensors are small, and one thread is not slowed "
                        "down by other work on the machine)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds (for the test suite)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    svi_steps, em_iters = [], ["--steps", "100"]
    if args.smoke:
        args.n_train, args.n_test = 200, 100
        svi_steps, em_iters = ["--steps", "20"], ["--steps", "5"]
    out = args.out.resolve()
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    train, test = data / "train.csv", data / "heldout.csv"
    run(["simulate", "--task", "transitive", "-n", str(args.n_train), "--seed", str(args.seed), "--out", str(train)])
    run(["simulate", "--task", "transitive", "-n", str(args.n_test), "--seed", str(args.seed + 1), "--out", str(test)])

    results, curves = [], {}
    for method, extra in (("svi", svi_steps), ("em", em_iters)):
        folder = out / method
        run(["train", "--data", str(train), "--val", str(test), "--model", "chained", "--method", method,
             "--hops", "2", "--sigma2", "0.1", "--seed", str(args.seed), "--out", str(folder), "--overwrite"] + extra)
        run(["evaluate", "--checkpoint", str(folder / "checkpoint.pt"), "--data", str(test),
             "--out", str(folder / "heldout.json")])
        run(["predict", "--checkpoint", str(folder / "checkpoint.pt"), "--data", str(test),
             "--out", str(folder / "predictions.csv")])
        run(["inspect", "--checkpoint", str(folder / "checkpoint.pt"), "--data", str(test), "--rows", "0", "1", "2",
             "--out", str(folder / "figures")])
        summary = json.loads((folder / "summary.json").read_text())
        heldout = json.loads((folder / "heldout.json").read_text())
        curves[method.upper()] = pd.read_csv(folder / "metrics.csv")
        results.append({
            "method": method.upper(),
            "heldout_log_likelihood": heldout["log_likelihood"],
            "heldout_accuracy": heldout["accuracy"],
            "train_log_likelihood": summary["train"]["log_likelihood"],
            "train_seconds": summary["seconds"],
            "steps_or_iterations": int(curves[method.upper()]["step"].iloc[-1]),
        })

    eye = torch.eye(30)
    truth = ChainedAttention(2, 30, 30, 0.1, key_tables=eye.expand(2, 30, 30), emission=eye)
    truth_test = truth.evaluate(Observations.load(test))
    results.append({
        "method": "generating structure",
        "heldout_log_likelihood": truth_test["log_likelihood"],
        "heldout_accuracy": truth_test["accuracy"],
        "train_log_likelihood": truth.evaluate(Observations.load(train))["log_likelihood"],
        "train_seconds": float("nan"),
        "steps_or_iterations": 0,
    })
    table = pd.DataFrame(results)
    table.to_csv(out / "comparison.csv", index=False)
    (out / "comparison.json").write_text(json.dumps(results, indent=2) + "\n")
    data_text = f"the transitive task ({args.n_train} training rows, {args.n_test} held-out rows)"
    figure = comparison_figure(curves, -truth_test["log_likelihood"], truth_test["accuracy"], data_text)
    figure.savefig(out / "comparison.png", dpi=110, bbox_inches="tight", pad_inches=0.1)

    print()
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s; outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
