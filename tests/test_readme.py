"""Every ```python block of README.md and of docs/*.md runs on its own and prints what its comments claim.

Each block runs in a fresh interpreter (a subprocess, PYTHONPATH set to this checkout), as a reader who
copies it would run it: with its own imports and data, nothing carried over from an earlier block.

A comment ``# prints: TEXT`` on a line of a block claims that ``TEXT`` appears in what the block prints, as
whole tokens (``0.885`` is not met by ``0.8855``);
the claims of a block must appear in its output in the order they are written. Write numbers in those
comments as the code rounds them, so the claim is the exact text printed.

Blocks that are not meant to run (fragments, shell sessions, output) are fenced as ```pycon, ```text,
```bash or ```console, never as ```python: there is no marker that skips a python block.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 600

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.M | re.S)
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.M)
_CLAIM = re.compile(r"#\s*prints:\s*(.+?)\s*$")


def _slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("`", "")).strip("-") or "top"


def _fenced_blocks(page):
    """``(language, code, line, heading)`` of each fenced block of ``page``, in order."""
    text = page.read_text()
    fences = list(_FENCE.finditer(text))
    headings = [
        (m.start(), m.group(1))
        for m in _HEADING.finditer(text)
        if not any(fence.start() < m.start() < fence.end() for fence in fences)  # not a comment in a code block
    ]
    for match in fences:
        before = [title for start, title in headings if start < match.start()]
        line = text.count("\n", 0, match.start()) + 1
        yield match.group(1).strip(), match.group(2), line, before[-1] if before else ""


def _python_blocks():
    params, seen = [], {}
    for page in PAGES:
        for language, code, line, heading in _fenced_blocks(page):
            if language != "python":
                continue
            block_id = f"{page.relative_to(ROOT)}:{_slug(heading)}"
            seen[block_id] = seen.get(block_id, 0) + 1
            if seen[block_id] > 1:
                block_id += f"-{seen[block_id]}"
            params.append(pytest.param(page, line, code, id=block_id))
    return params


def _claims(code):
    return [m.group(1) for m in map(_CLAIM.search, code.splitlines()) if m]


def _claim_pattern(claim):
    """``claim`` as whole tokens: a claim that starts or ends with a letter or digit does not match inside a
    longer word or number (``0.885`` is not found in ``0.8855``, nor ``5`` in ``0.5`` or ``15``)."""
    left = r"(?<![\w.])" if re.match(r"\w", claim[0]) else ""
    right = r"(?!\w)(?!\.\d)" if re.match(r"\w", claim[-1]) else ""
    return re.compile(left + re.escape(claim) + right)


def _unmet_claim(code, stdout):
    """The first claim of ``code`` that ``stdout`` does not print, as whole tokens, after the earlier claims'
    matches, or None."""
    position = 0
    for claim in _claims(code):
        found = _claim_pattern(claim).search(stdout, position)
        if found is None:
            return claim
        position = found.end()
    return None


@pytest.mark.parametrize("claim, printed, met", [
    ("0.885", "accuracy 0.8855\n", False),
    ("0.885", "accuracy 0.885\n", True),
    ("0.885", "accuracy 0.885.\n", True),
    ("5", "0.5 15 5\n", True),
    ("5", "0.5 15\n", False),
    ("[0, 1]", "x[0, 1]\n", True),
    ("tensor([1, 2])", "tensor([1, 2])\n", True),
])
def test_claims_compare_whole_tokens(claim, printed, met):
    assert (_unmet_claim(f"print(x)  # prints: {claim}", printed) is None) == met


@pytest.mark.parametrize("page, line, code", _python_blocks())
def test_python_block_runs_and_prints_its_claims(page, line, code, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    where = f"{page.relative_to(ROOT)}, block at line {line}"
    assert result.returncode == 0, f"{where} failed:\n{result.stderr[-4000:]}"
    unmet = _unmet_claim(code, result.stdout)
    assert unmet is None, f"{where}: a comment claims it prints {unmet!r} (in this order); it printed:\n{result.stdout}"


def test_the_readme_has_a_runnable_quick_start():
    blocks = [code for language, code, _, heading in _fenced_blocks(ROOT / "README.md") if language == "python"]
    assert blocks, "the README has no python block"
    assert all(_claims(code) for code in blocks), "every README python block states what it prints"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_python_block_escapes_the_runner(page):
    """A block fenced as ```py, ```python3 or ```{code-block} python would be shown as Python but never run."""
    escaped = [
        (line, language)
        for language, _, line, _ in _fenced_blocks(page)
        if language in ("py", "python3", "ipython") or re.match(r"\{(code-block|code|code-cell)\}\s*python", language)
    ]
    assert not escaped, f"{page.name}: python blocks this test would not run (line, fence): {escaped}"


def test_claim_check_fails_on_a_wrong_or_misordered_claim():
    code = 'print(round(accuracy, 3))  # prints: {}\nprint("done")  # prints: done\n'
    assert _claims(code.format("0.886")) == ["0.886", "done"]
    assert _unmet_claim(code.format("0.886"), "0.886\ndone\n") is None
    assert _unmet_claim(code.format("0.90"), "0.886\ndone\n") == "0.90"
    assert _unmet_claim(code.format("0.886"), "done\n0.886\n") == "done"
