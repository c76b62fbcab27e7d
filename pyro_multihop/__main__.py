"""``python -m pyro_multihop``: the ``pyro-multihop`` command, also under ``torchrun -m pyro_multihop``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
