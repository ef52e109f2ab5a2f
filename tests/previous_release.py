"""The previous release of dramatiq-unique, as a user installs it: a wheel built from its git tag,
installed into a directory of its own.

A process runs that release when the directory comes first on its PYTHONPATH: the package comes
from the release, everything else (Dramatiq, redis-py) from the test environment.

``previous-release.txt``, beside this file, names the release: its tag and its commit. The release
is found by its tag, or in a clone without tags by its commit; when neither is in the git history,
the tests that need it are skipped. After a new release, write its tag and commit there.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

RECORD = Path(__file__).with_name("previous-release.txt")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Release:
    #: The version its package says it is (``dramatiq_unique.__version__``).
    version: str
    #: The directory the release is installed in: first on PYTHONPATH, it runs the release.
    site: Path


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True)


def _revision(tag: str, commit: str) -> str:
    """The tag if the clone has it, else the commit; skips the test if the history has neither."""
    for revision in (tag, commit):
        if _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}").returncode == 0:
            return revision
    pytest.skip(
        f"The previous release {tag} (commit {commit}) is not in this clone's git history: "
        "run `git fetch --tags` to test a rolling upgrade from it."
    )


def _run(*args: str, what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"Could not {what} ({done.returncode}):\n{done.stdout}{done.stderr}")


def build_previous_release(directory: Path) -> Release:
    """Build the previous release's wheel from its git tree and install it under ``directory``."""
    tag, commit = RECORD.read_text().split()
    revision = _revision(tag, commit)
    source, wheels, site = directory / "source", directory / "wheels", directory / "site"
    source.mkdir()
    archive = _git("archive", "--format=tar", revision)
    if archive.returncode != 0:
        raise RuntimeError(f"git archive {revision} failed: {archive.stderr.decode()}")
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive.stdout, check=True)
    # Without build isolation the wheel is built with this environment's setuptools (the test
    # extra has one that reads the release's pyproject.toml): seconds, and no package index.
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    _run(
        *pip,
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
        str(source),
        what=f"build the wheel of {tag} (is the test extra installed? make .venv/.test)",
    )
    (wheel,) = wheels.glob("dramatiq_unique-*.whl")
    _run(*pip, "install", "--no-deps", "--target", str(site), str(wheel), what=f"install the wheel of {tag}")
    return Release(version=tag.removeprefix("v"), site=site)
