"""Every ```python block of README.md and of docs/*.md runs on its own and prints what its comments claim.

Each block runs in a process of its own, as a reader who copies it would run it: with its own imports and
data, nothing carried over from an earlier block. The processes are forked from a multiprocessing
``forkserver`` that has imported torch, Pyro and the library's modules once and run nothing: a block starts
in ~0.1 s instead of the ~2.3 s of a fresh interpreter's imports (53 blocks: about two minutes of ``make
test``), in the state a fresh interpreter reaches after its imports.

A comment ``# prints: TEXT`` on a line of a block claims that ``TEXT`` appears in what the block prints, as
whole tokens (``0.885`` is not met by ``0.8855``);
the claims of a block must appear in its output in the order they are written. Write numbers in those
comments as the code rounds them, so the claim is the exact text printed.

Blocks that are not meant to run (fragments, shell sessions, output) are fenced as ```pycon, ```text,
```bash or ```console, never as ```python: there is no marker that skips a python block.
"""

import inspect
import multiprocessing
import multiprocessing.forkserver
import os
import re
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK_TIMEOUT_S = 600


def _public_modules():
    """The modules that define ``pyro_multihop``'s public names (the package resolves them on first use)."""
    import pyro_multihop

    named = (getattr(pyro_multihop, name) for name in pyro_multihop.__all__)
    return sorted({obj.__name__ if inspect.ismodule(obj) else obj.__module__
                   for obj in named if inspect.ismodule(obj) or hasattr(obj, "__module__")})


#: Imported once by the fork server, before any block runs. Only imports: no tensor is computed there, so a forked
#: child starts with torch's thread pools unstarted. (torch.optim imports torch._dynamo on first use: 1.4 s.)
PRELOAD = ["torch", "torch._dynamo", "pyro", "pandas", "pyro_multihop", *_public_modules()]

# Run in the forked child with exec: the block's directory and output files, then the block as __main__ (so that
# tracebacks name "<block>" and its own line numbers).
_CHILD = """
import os, sys
os.chdir(CWD)
for fd, path in ((1, STDOUT), (2, STDERR)):
    with open(path, "w") as file:
        os.dup2(file.fileno(), fd)
sys.argv = ["-c"]
exec(compile(CODE, "<block>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
"""

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


@pytest.fixture(scope="module")
def fork_server():
    """The forkserver context, its server started with the block's environment (this checkout on the path,
    matplotlib without a display) and :data:`PRELOAD` imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    saved = dict(os.environ)
    os.environ.update(PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return context


def run_block(context, code, cwd):
    """``(exit code, stdout, stderr)`` of ``code`` run as ``__main__`` in a process forked from ``context``'s
    server, in directory ``cwd``; a block still running after :data:`BLOCK_TIMEOUT_S` is killed (exit code None)."""
    with tempfile.TemporaryDirectory() as outputs:  # not in cwd, where the block may list its own files
        stdout, stderr = os.path.join(outputs, "stdout"), os.path.join(outputs, "stderr")
        names = {"CODE": code, "CWD": str(cwd), "STDOUT": stdout, "STDERR": stderr}
        process = context.Process(target=exec, args=(_CHILD, names))
        process.start()
        process.join(BLOCK_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
            exitcode = None
        else:
            exitcode = process.exitcode
        texts = []
        for path in (stdout, stderr):
            with open(path) as file:
                texts.append(file.read())
    return exitcode, *texts


def test_the_runner_reports_failures_output_and_directory(fork_server, tmp_path):
    code = "import os, sys\nprint(os.getcwd(), os.listdir())\nprint('to stderr', file=sys.stderr)\nraise SystemExit(3)\n"
    assert run_block(fork_server, code, tmp_path) == (3, f"{tmp_path} []\n", "to stderr\n")
    exitcode, _, stderr = run_block(fork_server, "x = 1\nundefined_name\n", tmp_path)
    assert exitcode == 1 and 'File "<block>", line 2' in stderr and "NameError" in stderr
    # nothing is carried over from one block to the next
    exitcode, _, stderr = run_block(fork_server, "print(x)\n", tmp_path)
    assert exitcode == 1 and "NameError" in stderr


@pytest.mark.parametrize("page, line, code", _python_blocks())
def test_python_block_runs_and_prints_its_claims(fork_server, page, line, code, tmp_path):
    exitcode, stdout, stderr = run_block(fork_server, code, tmp_path)
    where = f"{page.relative_to(ROOT)}, block at line {line}"
    assert exitcode == 0, f"{where} failed (exit code {exitcode}):\n{stderr[-4000:]}"
    unmet = _unmet_claim(code, stdout)
    assert unmet is None, f"{where}: a comment claims it prints {unmet!r} (in this order); it printed:\n{stdout}"


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
