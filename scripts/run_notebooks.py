#!/usr/bin/env python
"""Execute the notebooks in ``notebooks/`` top to bottom with nbclient, at a chosen size.

The notebooks read their size from the environment variable ``PYRO_MULTIHOP_NOTEBOOK_SIZE``:
``smoke`` (tiny data and few iterations, what the test suite runs) or ``full`` (the sizes of the
issue, the default when the variable is unset; a few minutes each on 2 cores). ::

    python scripts/run_notebooks.py --size full --inplace          # refresh the stored outputs
    python scripts/run_notebooks.py --size smoke --out /tmp/nbs    # executed copies elsewhere
    python scripts/run_notebooks.py 02 --size smoke                # one notebook (number, name or path)

The kernel is the Python running this script (a kernelspec written to a temporary directory and found
through ``JUPYTER_PATH``), never a ``python3`` kernel registered elsewhere on the machine, so the
notebooks see the same environment (``.venv``) as the tests. No per-cell timing metadata is recorded, so a
re-run changes only the outputs themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional, Union

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
SIZE_VARIABLE = "PYRO_MULTIHOP_NOTEBOOK_SIZE"
SIZES = ("smoke", "full")
KERNEL_NAME = "pyro-multihop-python"
# The kernelspec recorded in the stored notebooks (what a reader's Jupyter opens them with).
STORED_KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def notebook_paths() -> List[Path]:
    """The notebooks of the repository, in order (``notebooks/NN_*.ipynb``)."""
    return sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))


def resolve(name: str) -> Path:
    """A notebook from a path, a file name, a stem such as ``02_hop_paths``, or its number ``02``."""
    path = Path(name)
    if path.is_file():
        return path.resolve()
    matches = [p for p in notebook_paths() if name in (p.name, p.stem) or p.stem.split("_")[0] == name]
    if len(matches) == 1:
        return matches[0]
    raise SystemExit(f"no notebook {name!r}; choose from {[p.stem for p in notebook_paths()]}")


@contextlib.contextmanager
def _this_python_kernel() -> Iterator[str]:
    """A kernelspec running ``sys.executable -m ipykernel_launcher``, visible through ``JUPYTER_PATH``."""
    from ipykernel.kernelspec import install

    previous = os.environ.get("JUPYTER_PATH")
    with tempfile.TemporaryDirectory(prefix="pyro-multihop-kernel-") as prefix:
        install(kernel_name=KERNEL_NAME, prefix=prefix, display_name="pyro-multihop (this Python)")
        share = os.path.join(prefix, "share", "jupyter")
        os.environ["JUPYTER_PATH"] = share if not previous else os.pathsep.join([share, previous])
        try:
            yield KERNEL_NAME
        finally:
            if previous is None:
                os.environ.pop("JUPYTER_PATH", None)
            else:
                os.environ["JUPYTER_PATH"] = previous


def execute_notebook(
    path: Union[str, Path],
    size: str = "smoke",
    output: Optional[Union[str, Path]] = None,
    timeout: int = 900,
):
    """Run the notebook at ``path`` top to bottom at ``size`` and return the executed ``NotebookNode``.

    :param size: ``"smoke"`` or ``"full"``, passed to the kernel as ``PYRO_MULTIHOP_NOTEBOOK_SIZE``.
    :param output: where to write the executed notebook (may be ``path`` itself); None writes nothing.
    :param timeout: seconds allowed per cell.
    :raises nbclient.exceptions.CellExecutionError: if a cell raises (the message names the cell).
    """
    import nbformat
    from nbclient import NotebookClient

    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    path = Path(path)
    notebook = nbformat.read(path, as_version=4)
    env = dict(os.environ, **{SIZE_VARIABLE: size})
    with _this_python_kernel() as kernel_name:
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name=kernel_name,
            record_timing=False,
            resources={"metadata": {"path": str(path.parent.resolve())}},
        )
        client.execute(env=env)
    notebook.metadata["kernelspec"] = dict(STORED_KERNELSPEC)
    if output is not None:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, output)
    return notebook


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="names or paths (default: every notebooks/NN_*.ipynb)")
    parser.add_argument("--size", choices=SIZES, default="full", help="smoke (tests) or full (default)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--inplace", action="store_true", help="store the outputs in the notebooks themselves")
    where.add_argument("--out", type=Path, help="write the executed notebooks to this directory")
    parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per cell (900)")
    args = parser.parse_args(argv)
    paths = [resolve(name) for name in args.notebooks] or notebook_paths()
    if not paths:
        raise SystemExit(f"no notebooks in {NOTEBOOK_DIR}")
    if args.inplace and args.size != "full":
        print("note: storing smoke-size outputs; the stored notebooks are meant to hold full-size ones",
              file=sys.stderr)
    for path in paths:
        output = path if args.inplace else (args.out / path.name if args.out else None)
        start = time.perf_counter()
        notebook = execute_notebook(path, args.size, output, args.timeout)
        seconds = time.perf_counter() - start
        written = f" -> {output}" if output else " (not written; use --inplace or --out)"
        size_kib = f", {output.stat().st_size / 1024:.0f} KiB" if output else ""
        print(f"{path.name}: {len(notebook.cells)} cells, {seconds:.1f} s at size {args.size}{size_kib}{written}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
