"""Every notebook runs top to bottom at smoke size (``PYRO_MULTIHOP_NOTEBOOK_SIZE=smoke``).

The notebooks are executed by ``scripts/run_notebooks.py`` (nbclient, a kernel on this very Python) into a
temporary directory: the stored notebooks, with their full-size outputs, are never touched. Each must
finish without error and its conclusion cell (tagged ``conclusion``) must have written its Markdown.
"""

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("nbclient")
pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ["01_exact_em_vs_svi", "02_hop_paths", "03_tied_embeddings_posterior", "04_babi", "05_own_facts",
             "06_yes_no_maybe"]


def _runner():
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stored_notebook_is_tested():
    stored = sorted(path.stem for path in (ROOT / "notebooks").glob("*.ipynb"))
    assert stored == sorted(NOTEBOOKS)


def test_docs_site_lists_every_notebook():
    page = (ROOT / "docs" / "notebooks.md").read_text()
    missing = [name for name in NOTEBOOKS if f"\nnotebooks/{name}\n" not in page or f"`notebooks/{name}.ipynb`" not in page]
    assert not missing, f"docs/notebooks.md neither describes nor lists in its toctree {missing}"


@pytest.mark.parametrize("name", NOTEBOOKS, ids=NOTEBOOKS)
def test_notebook_runs_at_smoke_size(name, tmp_path):
    runner = _runner()
    path = ROOT / "notebooks" / f"{name}.ipynb"
    stored = path.read_bytes()
    output = tmp_path / path.name
    notebook = runner.execute_notebook(path, size="smoke", output=output)  # raises CellExecutionError on failure

    assert path.read_bytes() == stored, "the stored notebook must not change"
    assert output.is_file()
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(cell.execution_count is not None for cell in code_cells)
    errors = [out for cell in code_cells for out in cell.outputs if out.output_type == "error"]
    assert not errors

    size_lines = [out.get("text", "") for out in code_cells[0].outputs if out.output_type == "stream"]
    assert any(re.search(r"\bsize smoke\b", text) for text in size_lines), "the notebook must report its size"

    conclusions = [cell for cell in code_cells if "conclusion" in cell.metadata.get("tags", [])]
    assert len(conclusions) == 1, "exactly one code cell is tagged 'conclusion'"
    markdown = [
        out["data"]["text/markdown"]
        for out in conclusions[0].outputs
        if out.output_type == "display_data" and "text/markdown" in out.get("data", {})
    ]
    assert markdown and re.search(r"\d", markdown[0]), "the conclusion states the notebook's own numbers"
