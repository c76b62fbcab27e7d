"""The shipped bAbI files are package data: a wheel built from the repository carries them, and a fresh
virtual environment with only that wheel installed (no editable checkout on its path) loads a task."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOAD_A_TASK = """
import json, pyro_multihop
from pyro_multihop.datasets import babi
questions = babi.read_babi(babi.task_files(babi.DEFAULT_DATA_DIR, 16, "test"))
print(json.dumps({"module": pyro_multihop.__file__, "data_dir": str(babi.DEFAULT_DATA_DIR),
                  "n": len(questions), "license": (babi.DEFAULT_DATA_DIR.parent / "LICENSE.txt").is_file(),
                  "source": (babi.DEFAULT_DATA_DIR.parent / "SOURCE.md").is_file(),
                  "files": len(list(babi.DEFAULT_DATA_DIR.glob("qa*_*.txt")))}))
"""


def test_wheel_installed_in_a_fresh_venv_loads_a_shipped_task(tmp_path):
    # Build from a copy of what the wheel is made of, so the build leaves nothing in the checkout.
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "pyro_multihop", source / "pyro_multihop", ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(dist), str(source)], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = dist.glob("pyro_multihop-*.whl")

    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(environment)
    python = environment / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    "--quiet", str(wheel)], check=True, capture_output=True, cwd=tmp_path)
    # torch, pyro and pandas come from this interpreter's site-packages, appended after the fresh venv's own
    # (a plain path line: the .pth files there, such as an editable install's finder, are not run).
    site_packages = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        check=True, capture_output=True, text=True).stdout.strip())
    (site_packages / "outer_site_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    run = subprocess.run([str(python), "-c", LOAD_A_TASK], check=True, capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(loaded["module"]).is_relative_to(environment), loaded["module"]
    assert Path(loaded["data_dir"]).is_relative_to(environment)
    assert loaded["n"] == 1000 and loaded["license"] and loaded["source"] and loaded["files"] == 22
