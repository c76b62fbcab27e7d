"""Real data sets as :class:`~pyro_multihop.data.Observations`: :mod:`pyro_multihop.datasets.babi`."""

from . import babi
from .babi import BabiData, BabiEncoder, BabiFormatError, load_task, read_babi

__all__ = ["babi", "BabiData", "BabiEncoder", "BabiFormatError", "load_task", "read_babi"]
