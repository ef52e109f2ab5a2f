# Two commands on a fresh machine: `make demo` and `make test` (and `make bench`, `make docs`).
# Each builds its own virtual environment from pyproject.toml.

PYTHON ?= python3
VENV ?= .venv

.PHONY: demo test bench lint docs clean

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

# The documentation site in docs/_build/html, read afresh (-E): any Sphinx warning fails the build.
docs: $(VENV)/.docs
	$(VENV)/bin/sphinx-build -W --keep-going -n -E -q -b html docs docs/_build/html

lint: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check dramatiq_unique tests examples benchmarks

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip

$(VENV)/.demo: pyproject.toml $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet -e '.[demo]'
	touch $@

$(VENV)/.docs: pyproject.toml $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet -e '.[docs]'
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/bin/python
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache docs/_build
