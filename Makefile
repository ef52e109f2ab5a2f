# Two commands on a fresh machine: `make demo` and `make test` (and `make bench`, `make docs`).
# Each builds its own virtual environment from pyproject.toml.

PYTHON ?= python3
VENV ?= .venv
# The oldest versions run on the Python given here (CI gives the oldest the package claims).
OLDEST_PYTHON ?= $(PYTHON)
OLDEST_VENV ?= .venv-oldest
# pytest-xdist workers, each with a redis-server of its own. The tests mostly wait (for servers,
# worker processes, leases), so more workers than cores: 6 on CI's two cores.
TEST_WORKERS ?= 6

.PHONY: demo test test-oldest bench lint docs clean

demo: $(VENV)/.demo
	$(VENV)/bin/python examples/demo.py

test: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict -p dramatiq_unique
	$(VENV)/bin/mypy --strict tests/typing/user_code.py
	$(VENV)/bin/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The type check and the tests once more, against the oldest versions pyproject.toml claims
# (.ci/oldest-versions.txt), without the tests that read only this checkout's files.
test-oldest: $(OLDEST_VENV)/.test
	$(OLDEST_VENV)/bin/python -c "import sys, dramatiq, redis; print('Python', sys.version.split()[0], 'dramatiq', dramatiq.__version__, 'redis-py', redis.__version__)"
	$(OLDEST_VENV)/bin/mypy --strict -p dramatiq_unique
	$(OLDEST_VENV)/bin/mypy --strict tests/typing/user_code.py
	$(OLDEST_VENV)/bin/python -m pytest -n $(TEST_WORKERS) -m "not version_independent" $(PYTEST_ARGS)

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
	$(OLDEST_PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install --quiet -c .ci/oldest-versions.txt -e '.[test]'
	touch $@

clean:
	rm -rf $(VENV) $(OLDEST_VENV) build dist *.egg-info .pytest_cache docs/_build
