"""The tied head's defaults, old against new, on two data sets.

Data sets (2 hops, ``D = 8``, ``sigma2 = 0.3`` for the tied head):

- ``distractor``: :func:`distractor_task`, 400 training and 100 test rows, ``S = 20``. Each row draws
  distinct symbols ``a, b, c``; the facts ``(a -> b)`` and ``(b -> c)`` and 4 distractor facts, whose keys
  avoid ``a`` and ``b`` (their values are random), are shuffled over 6 positions; the query is ``a`` and the
  target ``c``. A head needs identity matching only.
- ``transitive``: ``transitive_task(S = 18, 3 pairs)``, 800 training and 2000 test rows (``docs/tied.md``).

Settings:

- ``old``: KL weight ``LinearAnnealing(0.1, 100)`` (the specification's reference) and the plug-in at the
  posterior means (``plug_in="mean"``), the defaults before this benchmark;
- ``new``: the defaults, ``LinearAnnealing(0.01, 100)`` and ``plug_in="expected"``.

Each is fitted by ``fit_svi`` (the head's ``svi_defaults()``: 300 full-batch steps) and by
``TiedEmbeddingVEM`` (its stopping rule, at most 1000 iterations), from each seed. The chained head
(``ChainedEM``, ``sigma2 = 0.1``) is the reference. Reported per fit: held-out plug-in accuracy and
negative log-likelihood per observation, the best held-out NLL during the SVI run and its step, the mean
posterior sd and the mean pairwise distance of the posterior means (the collapse measures of
``docs/tied.md``), iterations and seconds.

Usage::

    python benchmarks/tied_defaults.py --out benchmarks/results          # about 5 minutes on one core
    python benchmarks/tied_defaults.py --out /tmp/tied --smoke          # seconds
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import torch

from pyro_multihop import ChainedEM, Observations, TiedEmbeddingAttention, TiedEmbeddingVEM, fit_svi, transitive_task
from pyro_multihop.diagnostics import posterior_spread
from pyro_multihop.guides import LinearAnnealing

SETTINGS = {
    "old": {"prior_strength": 0.1, "plug_in": "mean"},
    "new": {"prior_strength": None, "plug_in": "expected"},  # None: the library's default
}


def distractor_task(n: int, num_symbols: int = 20, distractors: int = 4, seed: int = 0) -> Observations:
    """Rows of ``2 + distractors`` positions: facts ``(a -> b)``, ``(b -> c)`` and distractor facts whose
    keys are distinct and avoid ``a`` and ``b`` (values uniform), in a random order; query ``a``, target ``c``."""
    generator = torch.Generator().manual_seed(seed)
    symbols = torch.rand(n, num_symbols, generator=generator).argsort(-1)  # a, b, c = the first three
    a, b, c = symbols[:, 0], symbols[:, 1], symbols[:, 2]
    others = symbols[:, 2:]  # every symbol but a and b (c included)
    pick = torch.rand(n, num_symbols - 2, generator=generator).argsort(-1)[:, :distractors]
    distractor_keys = others.gather(1, pick)
    distractor_values = torch.randint(num_symbols, (n, distractors), generator=generator)
    keys = torch.cat([a[:, None], b[:, None], distractor_keys], 1)
    values = torch.cat([b[:, None], c[:, None], distractor_values], 1)
    order = torch.rand(n, distractors + 2, generator=generator).argsort(-1)
    return Observations(keys.gather(1, order), values.gather(1, order), a, c)


def data_sets(smoke: bool) -> dict:
    if smoke:
        return {"distractor": (distractor_task(60, seed=0), distractor_task(30, seed=1), 20)}
    return {
        "distractor": (distractor_task(400, seed=0), distractor_task(100, seed=1), 20),
        "transitive": (transitive_task(800, num_symbols=18, pairs=3, seed=0),
                       transitive_task(2000, num_symbols=18, pairs=3, seed=1), 18),
    }


def tied_options(setting: dict, method: str) -> dict:
    strength = setting["prior_strength"]
    if method == "svi":
        return {"plug_in": setting["plug_in"], **({} if strength is None else {"annealing": LinearAnnealing(strength, 100)})}
    return {"plug_in": setting["plug_in"], **({} if strength is None else {"prior_strength": strength})}


def fit_one(method: str, setting: dict, train, test, symbols: int, seed: int, smoke: bool) -> dict:
    started = time.perf_counter()
    best_nll, best_step = float("nan"), float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the diagnostics' warnings: the table reports their measures
        if method == "svi":
            head = TiedEmbeddingAttention(symbols, 8, symbols, seed=seed, **tied_options(setting, "svi"))
            metrics = fit_svi(head, train, val=test, seed=seed, progress=False, **({"num_steps": 20} if smoke else {}))
            iterations = int(metrics["step"].iloc[-1])
            best = metrics["val_log_likelihood"].idxmax()
            best_nll, best_step = -float(metrics.at[best, "val_log_likelihood"]), int(metrics.at[best, "step"])
        else:
            vem = TiedEmbeddingVEM(symbols, 8, symbols, seed=seed, max_iters=30 if smoke else 1000,
                                   **tied_options(setting, "vem")).fit(train)
            head, iterations = vem.to_head(), vem.n_iter_
    seconds = time.perf_counter() - started
    scores = head.evaluate(test)
    sd, distance = posterior_spread(*head.embeddings())
    return {"accuracy": scores["accuracy"], "nll": -scores["log_likelihood"], "best_nll": best_nll,
            "best_step": best_step, "posterior_sd": sd, "pairwise_distance": distance,
            "iterations": iterations, "seconds": seconds}


def run(smoke: bool, seeds) -> pd.DataFrame:
    torch.set_num_threads(1)
    rows = []
    for name, (train, test, symbols) in data_sets(smoke).items():
        started = time.perf_counter()
        chained = ChainedEM(n_hops=2, num_symbols=symbols, num_targets=symbols, sigma2=0.1).fit(train, seed=0)
        scores = chained.model.evaluate(test)
        rows.append({"data": name, "method": "ChainedEM (reference)", "defaults": "-", "seed": 0,
                     "accuracy": scores["accuracy"], "nll": -scores["log_likelihood"],
                     "iterations": chained.n_iter, "seconds": time.perf_counter() - started})
        for method in ("svi", "vem"):
            for label, setting in SETTINGS.items():
                for seed in seeds:
                    row = fit_one(method, setting, train, test, symbols, seed, smoke)
                    rows.append({"data": name, "method": "fit_svi" if method == "svi" else "TiedEmbeddingVEM",
                                 "defaults": label, "seed": seed, **row})
                    print(rows[-1], flush=True)
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    summary = table.groupby(["data", "method", "defaults"], sort=False).agg(
        accuracy=("accuracy", "mean"), accuracy_min=("accuracy", "min"), nll=("nll", "mean"),
        best_nll=("best_nll", "mean"), best_step=("best_step", "mean"), sd=("posterior_sd", "mean"),
        distance=("pairwise_distance", "mean"), iterations=("iterations", "mean"), seconds=("seconds", "mean"),
        seeds=("seed", "count")).reset_index()
    lines = [
        "| data | method | defaults | accuracy (min) | held-out NLL | best held-out NLL (step) | posterior sd "
        "| pairwise distance | iterations | seconds |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in summary.itertuples():
        best = "-" if pd.isna(row.best_nll) else f"{row.best_nll:.3f} ({row.best_step:.0f})"
        sd = "-" if pd.isna(row.sd) else f"{row.sd:.2f}"
        distance = "-" if pd.isna(row.distance) else f"{row.distance:.2f}"
        lines.append(f"| {row.data} | {row.method} | {row.defaults} | {row.accuracy:.3f} ({row.accuracy_min:.3f}) "
                     f"| {row.nll:.3f} | {best} | {sd} | {distance} | {row.iterations:.0f} | {row.seconds:.1f} |")
    lines += ["", f"Means over {int(summary['seeds'].max())} seeds (accuracy: mean and minimum). old: KL weight "
              "0.1 and the posterior-mean plug-in; new: KL weight 0.01 and the expected-distance plug-in. "
              f"`python benchmarks/tied_defaults.py`, torch {torch.__version__}, one thread, {platform.machine()}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    table = run(args.smoke, [0] if args.smoke else args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "tied_defaults.csv", index=False)
    (args.out / "tied_defaults.md").write_text(markdown(table))
    print(f"wrote {args.out / 'tied_defaults.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
