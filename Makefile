VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
OUT ?= demo_output

.PHONY: venv test demo docs bench clean

venv: $(VENV)/.installed

# torch 2.13.0 goes in first, from the constraints file, so that no later requirement pulls another build.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

# Two workers (CI and the project's machines have 2 cores); a test file stays on one worker, so module
# fixtures (the Sphinx build, the spawned process groups) run once.
test: venv
	$(PY) -m pytest -q -n 2 --dist loadfile

demo: venv
	$(PY) scripts/demo.py --out $(OUT)

# The documentation site (Sphinx, MyST Markdown, notebooks rendered from their stored outputs).
docs: venv
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

bench: venv
	$(PY) benchmarks/run_all.py --out benchmarks/results

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache docs/_build docs/generated
