# Two commands on a fresh machine: `make demo` and `make test` (and `make bench`).
# Each builds its own virtual environment from pyproject.toml.

PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test bench lint clean

demo: $(VENV)/.demo
	$(VENV)/bin/python examples/demo.py

test: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict -p dramatiq_unique
	$(VENV)/bin/mypy --strict tests/typing/user_code.py
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# Every figure of docs/performance.md from one run, with the machine it ran on (a few minutes).
bench: $(VENV)/.test
	$(VENV)/bin/python benchmarks/report.py

lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check dramatiq_unique tests examples benchmarks

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet -e '.[demo]'
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
