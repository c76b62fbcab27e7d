"""Hop-path tables of a fitted head, written in chunks: what ``pyro-multihop paths`` writes.

For each row: the ``k`` most probable hop paths given the target (:meth:`k_best_paths
<pyro_multihop.models.HopAttentionHead.k_best_paths>`), best first, with their posterior probabilities and the
``key:value`` attended at each hop (words when a vocabulary is given), the entropy of the path posterior in nats
(:meth:`path_entropy <pyro_multihop.models.HopAttentionHead.path_entropy>`) and optionally paths drawn from the
posterior (:meth:`sample_paths <pyro_multihop.models.HopAttentionHead.sample_paths>`).

Formats, by the file's suffix:

- ``.csv``: one line per row, columns ``row, query, target, entropy``, then for each rank ``j = 1..k``
  ``path_j_prob`` and, for each hop ``l``, ``path_j_hop_l`` (the context position) and ``path_j_hop_l_attended``
  (``key:value``), then ``sample_s_hop_l`` positions. A rank beyond the row's number of paths is left empty.
- ``.jsonl``: one JSON object per row: ``row``, ``query``, ``target``, ``entropy``, ``paths`` (a list of
  ``{"probability", "positions", "attended"}``, only paths of positive probability) and ``samples`` (a list
  of position lists).

Example::

    >>> import io
    >>> from pyro_multihop import ChainedAttention, transitive_task
    >>> from pyro_multihop.path_tables import path_records
    >>> head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
    >>> record = next(path_records(head, transitive_task(4, seed=0), k=2))
    >>> sorted(record)
    ['attended', 'entropy', 'positions', 'probabilities', 'query', 'row', 'samples', 'target']
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import torch

from .runs import progress_bar

__all__ = ["PATH_FORMATS", "path_records", "write_paths"]

#: File suffixes :func:`write_paths` writes.
PATH_FORMATS = (".csv", ".jsonl")


def _namer(names: Optional[Sequence[str]]):
    def name(index: int) -> str:
        return str(names[index]) if names is not None and 0 <= index < len(names) else str(index)

    return name


def path_records(model, obs, k: int = 3, *, num_samples: int = 0, seed: int = 0, chunk_size: int = 4096,
                 vocabulary: Optional[dict] = None, progress: bool = False) -> Iterator[dict]:
    """One dict per row of ``obs``, computed ``chunk_size`` rows at a time: ``row``, ``query``, ``target``
    (words with a ``vocabulary`` ``{"symbols": [...], "targets": [...]}``), ``entropy`` (nats),
    ``probabilities`` (``k`` floats, best first, 0 where the row has fewer paths), ``positions`` (``k`` lists of
    ``L`` context positions), ``attended`` (``k`` lists of ``L`` ``"key:value"`` strings) and ``samples``
    (``num_samples`` lists of ``L`` positions, drawn with seed ``seed + chunk index``)."""
    vocabulary = vocabulary or {}
    symbol, target_name = _namer(vocabulary.get("symbols")), _namer(vocabulary.get("targets"))
    n = len(obs)
    with progress_bar(n, desc="paths", unit="row", enabled=progress) as bar:
        for chunk_index, start in enumerate(range(0, n, chunk_size)):
            chunk = obs[start : start + chunk_size]
            with torch.no_grad():
                paths, log_probs = model.k_best_paths(chunk, k)
                entropy = model.path_entropy(chunk)
                samples = model.sample_paths(chunk, num_samples, seed=seed + chunk_index) if num_samples else None
            paths, probs, entropy = paths.cpu(), log_probs.exp().cpu(), entropy.cpu()
            keys, values = chunk.keys.cpu(), chunk.values.cpu()
            query, target = chunk.query.cpu().tolist(), chunk.target.cpu().tolist()
            for i in range(len(chunk)):
                row_keys, row_values = keys[i], values[i]
                positions = paths[i].tolist()
                yield {
                    "row": start + i,
                    "query": symbol(query[i]),
                    "target": target_name(target[i]),
                    "entropy": float(entropy[i]),
                    "probabilities": probs[i].tolist(),
                    "positions": positions,
                    "attended": [[f"{symbol(int(row_keys[p]))}:{symbol(int(row_values[p]))}" for p in path]
                                 for path in positions],
                    "samples": [] if samples is None else samples[:, i].cpu().tolist(),
                }
            bar.update(len(chunk))


def _csv_line(record: dict, k: int, n_hops: int, num_samples: int) -> list:
    line = [record["row"], record["query"], record["target"], repr(record["entropy"])]
    for j in range(k):
        probability = record["probabilities"][j]
        if probability > 0:
            line.append(repr(probability))
            for hop in range(n_hops):
                line += [record["positions"][j][hop], record["attended"][j][hop]]
        else:
            line += [""] * (1 + 2 * n_hops)
    for sample in record["samples"]:
        line += sample
    return line


def write_paths(model, obs, out: Union[str, os.PathLike], k: int = 3, *, num_samples: int = 0, seed: int = 0,
                chunk_size: int = 4096, vocabulary: Optional[dict] = None, progress: bool = False) -> int:
    """Write :func:`path_records` of ``obs`` to ``out`` (``.csv`` or ``.jsonl``, module docstring), streaming
    one chunk at a time; returns the number of rows written."""
    import csv

    out = Path(out)
    if out.suffix not in PATH_FORMATS:
        raise ValueError(f"out must end in {' or '.join(PATH_FORMATS)}, got {str(out)!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    n_hops = int(model.n_hops)
    records = path_records(model, obs, k, num_samples=num_samples, seed=seed, chunk_size=chunk_size,
                           vocabulary=vocabulary, progress=progress)
    count = 0
    with open(out, "w", newline="") as stream:
        if out.suffix == ".csv":
            writer = csv.writer(stream)
            header = ["row", "query", "target", "entropy"]
            for j in range(1, k + 1):
                header.append(f"path_{j}_prob")
                for hop in range(1, n_hops + 1):
                    header += [f"path_{j}_hop_{hop}", f"path_{j}_hop_{hop}_attended"]
            header += [f"sample_{s}_hop_{hop}" for s in range(1, num_samples + 1) for hop in range(1, n_hops + 1)]
            writer.writerow(header)
            for record in records:
                writer.writerow(_csv_line(record, k, n_hops, num_samples))
                count += 1
        else:
            for record in records:
                kept = [j for j, p in enumerate(record["probabilities"]) if p > 0]
                line = {
                    "row": record["row"], "query": record["query"], "target": record["target"],
                    "entropy": record["entropy"],
                    "paths": [{"probability": record["probabilities"][j], "positions": record["positions"][j],
                               "attended": record["attended"][j]} for j in kept],
                    "samples": record["samples"],
                }
                stream.write(json.dumps(line) + "\n")
                count += 1
    return count
