VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
OUT ?= demo_output

.PHONY: venv test demo bench clean

venv: $(VENV)/.installed

# torch 2.13.0 goes in first, from the constraints file, so that no later requirement pulls another build.
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

test: venv
	$(PY) -m pytest -q

demo: venv
	$(PY) scripts/demo.py --out $(OUT)

bench: venv
	$(PY) benchmarks/run_all.py --out benchmarks/results

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache
