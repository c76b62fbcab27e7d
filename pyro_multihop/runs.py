"""What every training command shares: a safe run directory and progress that suits where output goes.

- :func:`prepare_run_dir` refuses to write into a folder that holds a trained checkpoint unless the user said
  ``resume`` or ``overwrite``, so that nothing a user trained is lost without an explicit flag.
- :func:`progress_bar` is a tqdm bar on a terminal and plain periodic log lines otherwise (a log file, a pipe,
  CI), where a bar's carriage returns would pile up into one long line.

Example::

    >>> import tempfile, pathlib
    >>> from pyro_multihop.runs import prepare_run_dir, RunDirError
    >>> out = pathlib.Path(tempfile.mkdtemp()) / "run"
    >>> prepare_run_dir(out).is_dir()             # a new folder: created
    True
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Optional, Union

__all__ = ["RunDirError", "prepare_run_dir", "progress_bar", "CHECKPOINT_NAME", "BEST_CHECKPOINT_NAME"]

#: File names of a run directory's last and best checkpoints.
CHECKPOINT_NAME = "checkpoint.pt"
BEST_CHECKPOINT_NAME = "best.pt"


class RunDirError(ValueError):
    """An output folder that holds a checkpoint, without ``resume`` or ``overwrite``."""


def prepare_run_dir(out: Union[str, os.PathLike], *, resume: bool = False, overwrite: bool = False,
                    resumable: bool = True, checkpoint_name: str = CHECKPOINT_NAME, create: bool = True) -> Path:
    """Check that training may write into the folder ``out`` and create it; returns it as a Path.

    A folder that holds ``checkpoint_name`` (a trained model) is refused with :class:`RunDirError` (one line
    naming the two flags) unless ``resume`` (continue from that checkpoint) or ``overwrite`` (replace it).
    ``resume`` and ``overwrite`` together are refused too: they contradict each other.

    :param resumable: whether the command can resume (its message offers ``--resume`` only then).
    :param create: create the folder (and its parents) when it is missing.
    :raises RunDirError: as above, or when ``out`` exists and is not a folder.
    """
    out = Path(out)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite contradict each other: give one")
    if out.exists() and not out.is_dir():
        raise RunDirError(f"--out {str(out)!r} exists and is not a folder")
    checkpoint = out / checkpoint_name
    if checkpoint.exists() and not (resume or overwrite):
        flags = "pass --resume to continue it or --overwrite to replace it" if resumable else "pass --overwrite to replace it"
        raise RunDirError(f"--out {str(out)!r} already holds a trained checkpoint ({checkpoint_name}); {flags}")
    if create:
        out.mkdir(parents=True, exist_ok=True)
    return out


class _LogLines:
    """A stand-in for a tqdm bar that writes ``desc: i/total (p%), rate, postfix`` lines to ``stream`` at each
    tenth of ``total`` and every ``every_s`` seconds between, plus one at the end: readable in a log file."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", unit: str = "it", stream=None,
                 every_s: float = 10.0):
        self.total, self.n, self.desc, self.unit = total, initial, desc, unit
        self.stream = sys.stderr if stream is None else stream
        self.every_s = every_s
        self.postfix = ""
        self.started = self.last = time.perf_counter()
        self.initial = initial
        self.next_mark = self._mark_after(initial)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.perf_counter()
        if now - self.last >= self.every_s or self.n >= self.next_mark:
            self.last = now
            self.next_mark = self._mark_after(self.n)
            self._write(now)

    def _mark_after(self, n: int) -> float:
        """The next multiple of a tenth of ``total`` above ``n``."""
        if not self.total:
            return float("inf")
        tenth = self.total / 10
        return (int(n / tenth) + 1) * tenth

    def set_postfix(self, refresh: bool = False, **values) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def _write(self, now: float) -> None:
        rate = (self.n - self.initial) / max(now - self.started, 1e-9)
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        tail = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total}{share}, {rate:.1f} {self.unit}/s{tail}", file=self.stream, flush=True)

    def close(self) -> None:
        if self.n > self.initial:
            self._write(time.perf_counter())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _Disabled:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, refresh: bool = False, **values) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress_bar(total: int, *, initial: int = 0, desc: str = "", unit: str = "it", enabled: bool = True,
                 terminal: Optional[bool] = None, every_s: float = 10.0):
    """A progress display on stderr: a tqdm bar when stderr is a terminal, else plain lines at each tenth of
    ``total``, every ``every_s`` seconds between and at the end (``terminal`` overrides the detection).
    With ``enabled=False`` nothing.

    It supports ``update(n)``, ``set_postfix(**values)`` and use as a context manager, like tqdm."""
    if not enabled:
        return _Disabled()
    if terminal is None:
        terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if terminal:
        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=False)
    return _LogLines(total, initial, desc, unit, every_s=every_s)
