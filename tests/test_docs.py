"""The documentation: every public name is in the API reference, and no text a user reads names
a requirement id of the specification (SPEC.md), which users cannot look up."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import tokenize
from pathlib import Path

import pytest

import dramatiq_unique

pytestmark = pytest.mark.version_independent

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dramatiq_unique"
API_REFERENCE = ROOT / "docs" / "reference" / "api.md"

# The specification lives beside the repository (a clone's ../shared/). Without it, the id
# families of its sections stand in for its ids.
SPEC = ROOT.parent / "shared" / "SPEC.md"
ID_FAMILIES = r"[CDLOPRS]\d{1,2}"

DIRECTIVE = re.compile(r"^\.\. (?:auto(?:class|function|data|exception)|py:data)::\s+(\S+)", re.MULTILINE)


def public_modules() -> list[str]:
    names = ["dramatiq_unique"]
    for module in pkgutil.walk_packages(dramatiq_unique.__path__, "dramatiq_unique."):
        # Importing __main__ would run the command.
        if not module.name.endswith(".__main__"):
            names.append(module.name)
    return names


def public_names() -> list[tuple[str, str]]:
    """(module, name) for every name of every ``__all__`` of the package."""
    names = []
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        names.extend((module_name, name) for name in getattr(module, "__all__", ()))
    return names


def documented_objects() -> list[object]:
    objects = []
    for target in DIRECTIVE.findall(API_REFERENCE.read_text()):
        module_name, _, name = target.rpartition(".")
        objects.append(getattr(importlib.import_module(module_name), name))
    return objects


def test_every_public_name_is_in_the_api_reference():
    documented = documented_objects()
    assert len(public_names()) > 60
    missing = [
        f"{module}.{name}"
        for module, name in public_names()
        if not any(getattr(importlib.import_module(module), name) is obj for obj in documented)
    ]
    assert missing == [], f"Not in {API_REFERENCE.relative_to(ROOT)}: {', '.join(missing)}"


def test_the_reference_lists_every_event_kind():
    # The entry of EVENT_KINDS is written by hand: autodoc finds no comment for a re-exported name.
    entry = API_REFERENCE.read_text().partition(".. py:data:: dramatiq_unique.EVENT_KINDS")[2].partition("\n\n.. ")[0]
    assert set(re.findall(r'``"(\w+)"``', entry)) == dramatiq_unique.EVENT_KINDS


def requirement_id() -> re.Pattern[str]:
    if SPEC.exists():
        ids = sorted(set(re.findall(r"\b[A-Z]{1,2}\d{1,2}\b", SPEC.read_text())) - {"MD5"})
        assert ids, f"{SPEC} names no requirement id"
        return re.compile(r"\b(?:SPEC )?(?:" + "|".join(ids) + r")\b")
    return re.compile(r"\b(?:SPEC )?" + ID_FAMILIES + r"\b")


def user_facing_texts() -> list[tuple[str, str]]:
    """(where, text) of what users read: the pages, the README, the web page's templates, and
    every string of the package (docstrings, log lines, error messages, command help) with the
    ``#:`` comments Sphinx documents attributes from. Other comments are for maintainers."""
    texts = [(str(path.relative_to(ROOT)), path.read_text()) for path in sorted((ROOT / "docs").rglob("*.md"))]
    texts.append(("README.md", (ROOT / "README.md").read_text()))
    texts.extend((str(path.relative_to(ROOT)), path.read_text()) for path in sorted(PACKAGE.rglob("*.html")))
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append((f"{where}:{node.lineno}", node.value))
        with path.open("rb") as source:
            for token in tokenize.tokenize(source.readline):
                if token.type == tokenize.COMMENT and token.string.startswith("#:"):
                    texts.append((f"{where}:{token.start[0]}", token.string))
    return [(where, text) for where, text in texts if "_build" not in where]


def test_no_user_facing_text_names_a_requirement_id():
    pattern = requirement_id()
    found = [f"{where}: {match.group()}" for where, text in user_facing_texts() for match in pattern.finditer(text)]
    assert found == []


@pytest.mark.parametrize(
    "text",
    ["Released once the lease runs out (SPEC R1).", "see L10", "    #: As S6 requires."],
)
def test_the_requirement_id_check_finds_ids(text):
    assert requirement_id().search(text)


@pytest.mark.parametrize("text", ["SHA-256, not MD5", "lock_ttl=5000", "HTTP2", "step 1"])
def test_the_requirement_id_check_leaves_other_words(text):
    assert not requirement_id().search(text)


SUBMODULE_IMPORT = re.compile(r"^\s*from (dramatiq_unique\.[\w.]+) import \(?([\w\s,]+)\)?", re.MULTILINE)


def test_what_the_package_exports_is_imported_from_the_package():
    # One import style in what users read and copy: from dramatiq_unique import RedisBackend, UniqueJobs.
    sources = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", *sorted((ROOT / "examples").glob("*.py"))]
    found = []
    for path in sources:
        for match in SUBMODULE_IMPORT.finditer(path.read_text()):
            names = {name.strip() for name in match.group(2).replace("\n", ",").split(",")} - {""}
            exported = sorted(names & set(dramatiq_unique.__all__))
            if exported:
                found.append(f"{path.relative_to(ROOT)}: from {match.group(1)} import {', '.join(exported)}")
    assert found == []
