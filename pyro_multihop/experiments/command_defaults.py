"""The defaults that the ``pyro-multihop`` commands show in their ``--help`` and use, in a module that imports
nothing (no torch): :mod:`pyro_multihop.cli` reads them to build its parser, so every ``--help`` answers without
loading torch (``benchmarks/help_time.py``), and the experiment modules run with the same values.

Owned here: the suffixes that tell table data from facts files (:data:`TABLE_SUFFIXES`, :data:`FACTS_SUFFIX`)
the bAbI settings of the chained head (:data:`BABI_SVI`, :data:`BABI_EM_ITERATIONS`, re-exported by
:mod:`pyro_multihop.experiments.chained_babi`) and the number of SVI starts (:data:`STARTS`). The others are the command's choice of a library default that a
module importing torch holds; the command passes them explicitly (so its help says what it runs), and
``tests/test_cli.py`` checks that they equal the library's: :data:`TRAIN_MODELS` (the keys of
:data:`pyro_multihop.models.registry.COMMAND_HEADS`), :data:`TRAIN_SIGMA2` (the heads' constructor defaults,
:func:`pyro_multihop.models.registry.default_sigma2`), :data:`TRAIN_EM_ITERATIONS`
(:data:`pyro_multihop.em.em_runs.CHAINED_EM_MAX_ITERS`) and :data:`BABI_MEMORY`
(:data:`pyro_multihop.datasets.babi.DEFAULT_MEMORY`).
"""

from __future__ import annotations

__all__ = ["TABLE_SUFFIXES", "FACTS_SUFFIX", "TRAIN_MODELS", "TRAIN_SIGMA2", "TRAIN_EM_ITERATIONS", "BABI_SVI",
           "BABI_EM_ITERATIONS", "BABI_MEMORY", "BABI_SIGMA2", "STARTS",
           "COMPARISON_STARTS", "COMPOSITION_DIM", "EMBED_DIM", "EMBED_MIN_COUNT"]

#: Suffixes of table data files (columns query, target, key_0.., value_0..): what ``simulate`` writes, ``train``
#: reads, and a ``train`` checkpoint is applied to.
TABLE_SUFFIXES = (".csv", ".parquet")
#: Suffix of a facts file (QA JSON Lines, docs/qa.md): what ``qa`` reads, and a ``qa`` checkpoint is applied to.
FACTS_SUFFIX = ".jsonl"

#: ``pyro-multihop train --model NAME``: the heads it fits on table data, the first the default.
TRAIN_MODELS = ("chained", "tied")

#: The gate variance of each ``--model`` when ``train`` is given no ``--sigma2``: the head's constructor default.
TRAIN_SIGMA2 = {"chained": 0.1, "tied": 0.3}

#: Most closed-form EM iterations of ``train --model chained --method em`` when ``--steps`` is not given.
TRAIN_EM_ITERATIONS = 100

#: Keyword arguments of :func:`~pyro_multihop.train.fit_svi` for bAbI through the chained head (``babi
#: --encoding positions``; measured on task 2, docs/babi.md): full-batch steps, learning rate decaying tenfold,
#: weight decay on the key tables (a stronger one than the chained head's default: the compound symbols give the
#: key tables many pair entries to memorise training stories with), contexts grouped by length in steps of 10
#: positions.
BABI_SVI = {"num_steps": 200, "lr": 0.1, "lr_decay": 0.1, "weight_decay": {"key_tables": 1e-2}, "group_lengths": 10}

#: Closed-form EM iterations of ``run_babi(method="em")`` when ``steps`` is not given.
BABI_EM_ITERATIONS = 50

#: Statements kept before each bAbI question (MemN2N's memory).
BABI_MEMORY = 50

#: Gate variance of the chained head on bAbI (``babi --encoding positions --sigma2``).
BABI_SIGMA2 = 0.1

#: ``qa --embed-dim`` given without a value: the symbol embeddings' dimension ``D``. Measured on the simulated
#: knowledge base (``benchmarks/knowledge_base.py``, 50,000 entities, unseen entities; docs/facts.md, "Which
#: ``D``").
EMBED_DIM = 32

#: ``qa --embed-min-count`` when not given: with ``--embed-dim``, only the symbols of at least this many training
#: questions own a row of the embedding (``FactAttention(embedded_symbols=...)``). Measured on the simulated
#: knowledge base (``benchmarks/knowledge_base.py``, unseen entities, answers / paths): at 50,000 entities (each in
#: about two training questions) 3 hops give 1.000 / 1.000 at 20 (64 symbols embedded: the relation and question
#: words), 0.996 / 0.760 at 5 (5,688: the entities of a 3-hop neighbourhood recur, and a row lets a question's
#: entity stand in for its first hop), 0.358 / 0.000 at 1; 2 hops 1.000 / 1.000 at 5 and 20, 0.686 / 0.078 at 1. At
#: 3,000 entities (each in about 30) 20 and 5 both give 1.000 / 1.000 (docs/facts.md).
EMBED_MIN_COUNT = 20

#: ``--starts K`` of ``train``, ``qa`` and ``babi`` when not given: SVI starts, the one with the best held-out
#: log-likelihood kept (``fit_svi(starts=K)``, docs/svi.md "Several starts"). 1: one plain fit. EM fits one start.
STARTS = 1

#: ``--starts`` of ``qa`` and ``babi`` (the facts head) when not given and the emission's comparison is on: start 0
#: with it, start 1 without it, starts 2 and 3 the same from the equality weights at 0, starts 4-7 the same four
#: with the word-order terms held at 0 (``FactAttention.start_variant``), the best by held-out log-likelihood kept.
#: Measured on bAbI 1k (docs/babi.md): with the first four alone tasks 9 and 15 fall into traps (80.8, 55.6); with
#: the last four alone (the starts before the pattern) tasks 10 and 6 lose what it gives (96.4 against 99.1, 92.9
#: against 93.9).
COMPARISON_STARTS = 8

#: ``qa`` and ``babi``'s composition of two facts (``FactAttention(composition=D)``) where the data turn it on (some
#: training answers occur in no fact, are not lists and are not said per hop) and no ``--composition`` is given: its
#: relation vectors' dimension ``D``. 2: a plane, the most bAbI's positional reasoning (task 17) composes; a size
#: order (task 18) needs 1 and fits in 2 (docs/babi.md).
COMPOSITION_DIM = 2
