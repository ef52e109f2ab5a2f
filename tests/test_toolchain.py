"""What `make test` and CI run on: the linter and the type checker pinned in one place, and the
corners CI tests the ones pyproject.toml claims (the oldest Python, the oldest dependencies)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.version_independent

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS: dict[str, list[str]] = PROJECT["optional-dependencies"]
#: The extras whose packages the library itself imports, beside its dependencies.
RUNTIME_EXTRAS = ("prometheus", "web")


def lower_bound(requirement: Requirement) -> Version:
    (bound,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    return Version(bound)


def test_the_linter_and_the_type_checker_are_pinned_in_one_place():
    pins = [Requirement(text) for text in EXTRAS["lint"]]
    assert sorted(pin.name for pin in pins) == ["mypy", "ruff"]
    assert all(len(pin.specifier) == 1 and next(iter(pin.specifier)).operator == "==" for pin in pins), pins
    named_elsewhere = [
        text
        for extra, texts in EXTRAS.items()
        if extra != "lint"
        for text in texts
        if Requirement(text).name in ("mypy", "ruff")
    ]
    assert named_elsewhere == []
    (itself,) = [Requirement(text) for text in EXTRAS["test"] if Requirement(text).name == "dramatiq-unique"]
    assert "lint" in itself.extras, "make test installs the test extra: it brings the pinned tools"


def test_ci_tests_the_oldest_versions_pyproject_allows():
    oldest = {}
    for line in (ROOT / ".ci" / "oldest-versions.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin = Requirement(line)
            oldest[pin.name.lower()] = Version(next(iter(pin.specifier)).version)
    allowed = {
        requirement.name.lower(): lower_bound(requirement)
        for requirement in map(Requirement, [*PROJECT["dependencies"], *(t for e in RUNTIME_EXTRAS for t in EXTRAS[e])])
    }
    assert oldest == allowed


def test_ci_runs_the_oldest_python_pyproject_claims():
    claimed = lower_bound(Requirement(f"python{PROJECT['requires-python']}"))
    run = (ROOT / ".ci" / "run").read_text()
    (oldest,) = re.findall(r"^OLDEST_PYTHON_VERSION=(\S+)$", run, re.MULTILINE)
    assert Version(oldest) == claimed
