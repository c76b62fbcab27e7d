"""Observations of chained-attention tasks: the containers, the strict file readers and the task simulators.

- :mod:`~pyro_multihop.data.observations`: :class:`Observations`, key/value contexts, a query and a target;
- :mod:`~pyro_multihop.data.readers`: CSV and Parquet files and frames read strictly into
  :class:`Observations`, or a :class:`DataError` naming the cell (sharded reads too);
- :mod:`~pyro_multihop.data.fact_observations`: :class:`FactObservations`, facts of several fields and a
  question, with their ``.pt`` files and sharded reads;
- :mod:`~pyro_multihop.data.simulators`: :func:`chain_task`, :func:`transitive_task`, :func:`induction_task`
  and :func:`fact_chain_task`, seeded tasks with a known generating structure.

Every name below is importable from ``pyro_multihop.data``.

Example::

    >>> from pyro_multihop.data import transitive_task
    >>> obs = transitive_task(100, num_symbols=30, pairs=5, seed=0)
    >>> obs.keys.shape, len(obs[:10])
    (torch.Size([100, 10]), 10)
"""

from .fact_observations import FILE_FORMAT, FactObservations
from .observations import Observations
from .readers import SYMBOL_LIMIT, DataError, read_columns
from .simulators import (
    FactChainVocabulary,
    chain_task,
    fact_chain_task,
    fact_chain_vocabulary,
    induction_task,
    transitive_task,
)

__all__ = [
    "DataError",
    "Observations",
    "SYMBOL_LIMIT",
    "read_columns",
    "chain_task",
    "transitive_task",
    "induction_task",
    "FactObservations",
    "FactChainVocabulary",
    "fact_chain_vocabulary",
    "fact_chain_task",
    "FILE_FORMAT",
]
