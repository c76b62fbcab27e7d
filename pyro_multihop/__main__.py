"""``python -m pyro_multihop``: the ``pyro-multihop`` command (see :mod:`pyro_multihop.cli`)."""

import sys

from .cli import main

sys.exit(main())
