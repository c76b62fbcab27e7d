"""Run directories and progress display: prepare_run_dir refuses a trained folder without a flag, and
progress off a terminal is a few plain lines, never a carriage-return bar."""

import io

import pytest

from pyro_multihop import runs
from pyro_multihop.runs import RunDirError, prepare_run_dir, progress_bar


def test_a_folder_with_a_checkpoint_needs_resume_or_overwrite(tmp_path):
    out = prepare_run_dir(tmp_path / "new" / "run")
    assert out.is_dir()
    (out / "checkpoint.pt").write_bytes(b"trained")
    with pytest.raises(RunDirError, match="--resume to continue it or --overwrite to replace it"):
        prepare_run_dir(out)
    with pytest.raises(RunDirError, match="pass --overwrite to replace it$"):
        prepare_run_dir(out, resumable=False)
    assert prepare_run_dir(out, resume=True) == out and prepare_run_dir(out, overwrite=True) == out
    with pytest.raises(RunDirError, match="contradict"):
        prepare_run_dir(out, resume=True, overwrite=True)
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="not a folder"):
        prepare_run_dir(tmp_path / "file")
    assert (out / "checkpoint.pt").read_bytes() == b"trained"


def test_progress_off_a_terminal_is_a_line_per_tenth(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(runs.sys, "stderr", stream)
    with progress_bar(200, desc="svi", unit="step", terminal=False, every_s=1e9) as bar:
        for _ in range(200):
            bar.update(1)
            bar.set_postfix(loss="0.5")
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert len(lines) == 10 and lines[0].startswith("svi: 20/200 (10%)") and "loss=0.5" in lines[-1]
    assert lines[-1].startswith("svi: 200/200 (100%)")
    with progress_bar(7, desc="rows", terminal=False, every_s=1e9) as bar:
        bar.update(3)
    assert stream.getvalue().splitlines()[-1].startswith("rows: 3/7 (43%)")  # the last count, at the end


def test_progress_disabled_writes_nothing(capsys):
    with progress_bar(10, enabled=False) as bar:
        bar.update(10)
    assert capsys.readouterr().err == ""
