# Two commands on a fresh machine: `make demo` and `make test` (and `make bench`, `make docs`).
# Each builds its own virtual environment from pyproject.toml.

PYTHON ?= python3
VENV ?= .venv
OLDEST_VENV ?= .venv-oldest

.PHONY: demo test test-oldest bench lint docs clean

demo: $(VENV)/.demo
	$(VENV)/bin/python examples/demo.py

test: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict -p dramatiq_unique
	$(VENV)/bin/mypy --strict tests/typing/user_code.py
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The tests once more, against the oldest versions pyproject.toml claims (.ci/oldest-versions.txt).
test-oldest: $(OLDEST_VENV)/.test
	$(OLDEST_VENV)/bin/python -c "import dramatiq, redis; print('dramatiq', dramatiq.__version__, 'redis-py', redis.__version__)"
	$(OLDEST_VENV)/bin/python -m pytest $(PYTEST_ARGS)

# Every figure of docs/performance.md from one run, with the machine it ran on (a few minutes).
bench: $(VENV)/.bench
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

# The test environment with the hiredis extra, which the bench compares with redis-py's own parser.
$(VENV)/.bench: $(VENV)/.test
	$(VENV)/bin/python -m pip install --quiet -e '.[test,hiredis]'
	touch $@

$(OLDEST_VENV)/.test: pyproject.toml .ci/oldest-versions.txt
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet -c .ci/oldest-versions.txt -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build dist *.egg-info .pytest_cache docs/_build
