"""The documentation as a newcomer reads it (issue 23): no sentence written on two pages, no page
too long to read without a reason, code that fits the page, and a README whose links work where
it is read, on GitHub and on PyPI."""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

pytestmark = pytest.mark.version_independent

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"

#: Longer than this, a page must say why in its first paragraph.
LONGEST_PAGE = 300
#: The widest line of code that fits a page of the site at 1280 pixels.
WIDEST_CODE_LINE = 88
#: A sentence this long or longer is a fact; written on two pages, it is a copy.
COPIED_SENTENCE_WORDS = 12

FENCE = re.compile(r"^(```+|:::+)")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
URL = re.compile(r"<(https?://[^>]+)>")


def pages() -> list[Path]:
    return sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts and path != DOCS / "README.md")


def name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def lines_by_block(text: str) -> list[tuple[str | None, str]]:
    """Each line of a page inside a fenced block (a code block or a directive), with the
    block's opening line, or outside any, with None. The fences themselves are left out."""
    found: list[tuple[str | None, str]] = []
    opening, fence = None, ""
    for line in text.splitlines():
        stripped = line.strip()
        marker = FENCE.match(stripped)
        if opening is None and marker:
            opening, fence = stripped, marker.group(1)[0] * 3
        elif opening is not None and stripped.startswith(fence) and stripped.strip(fence[0]) == "":
            opening = None
        else:
            found.append((opening, line))
    return found


def prose_lines(text: str) -> list[str]:
    """The lines of a page outside its fenced blocks (code, directives)."""
    return [line for opening, line in lines_by_block(text) if opening is None]


def sentences(text: str) -> list[str]:
    """The sentences of a page's prose, each with its links reduced to their text and its words
    lowercased, so that the same sentence linked differently is still the same."""
    found = []
    for block in re.split(r"\n\s*\n|\n\s*[-*] |\n\s*\d+\. |\n\|", "\n".join(prose_lines(text))):
        block = LINK.sub(r"\1", block)
        block = re.sub(r"[`*_|>#]", " ", block)
        for sentence in re.split(r"(?<=[.!?:;])\s+", " ".join(block.split())):
            words = re.findall(r"[\w'’…-]+", sentence.lower())
            if len(words) >= COPIED_SENTENCE_WORDS:
                found.append(" ".join(words))
    return found


def test_no_sentence_is_written_on_two_pages():
    places = defaultdict(set)
    for path in pages():
        for sentence in sentences(path.read_text()):
            places[sentence].add(name(path))
    copied = {sentence: sorted(where) for sentence, where in places.items() if len(where) > 1}
    assert copied == {}, "a fact has one home; link to it:\n" + "\n".join(
        f"{where}: {sentence}" for sentence, where in copied.items()
    )


def test_the_copy_check_sees_a_sentence_linked_differently():
    one = "A lock removes [concurrent](a.md) duplicates while it is held, and no longer than that, ever."
    other = "A lock removes *concurrent* duplicates while it is held, and no longer than that, ever."
    assert sentences(one) == sentences(other) != []
    assert sentences("```python\n" + one + "\n```\n") == []


def test_the_messages_dramatiq_enqueues_itself_are_listed_on_one_page():
    # The list (a pipeline's next step, a group's completion callback, on_success ...) was copied
    # into six pages in three versions that disagreed.
    listing = [name(path) for path in pages() if "on_retry_exhausted" in path.read_text()]
    assert listing == ["docs/lock-types.md"]
    assert "### Messages Dramatiq enqueues itself" in (DOCS / "lock-types.md").read_text()


def test_a_long_page_says_why_in_its_first_paragraph():
    too_long = []
    for path in pages():
        lines = path.read_text().splitlines()
        if len(lines) <= LONGEST_PAGE:
            continue
        first_paragraph = "\n".join(lines[1:]).strip().split("\n\n")[0]
        if "long" not in first_paragraph:
            too_long.append(f"{name(path)}: {len(lines)} lines")
    assert too_long == []


def fenced_code_lines(text: str) -> list[str]:
    """The lines of a page's code blocks: not of its directives (a toctree, an image), except
    {code-block}."""

    def is_code(opening: str) -> bool:
        info = opening.lstrip("`:")
        return not info.startswith("{") or info.startswith("{code")

    return [line for opening, line in lines_by_block(text) if opening is not None and is_code(opening)]


INCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)\n((?::[\w-]+:.*\n)*)", re.MULTILINE)


def included_lines(page: Path, target: str, options: str) -> list[str]:
    """The lines of a file that a literalinclude shows, as far as its start-after, end-before and
    lines options narrow it (with others, such as pyobject, the whole file counts)."""
    text = (page.parent / target).resolve().read_text()
    # MyST reads a directive's options as YAML: a value may be quoted.
    option = {key: value.strip().strip("\"'") for key, value in re.findall(r"^:([\w-]+):(.*)$", options, re.MULTILINE)}
    if "start-after" in option:
        text = text.split(option["start-after"], 1)[1].split("\n", 1)[-1]
    if "end-before" in option:
        text = text.split(option["end-before"], 1)[0]
    lines = text.splitlines()
    if "lines" in option:
        first, _, last = option["lines"].partition("-")
        lines = lines[int(first) - 1 : int(last) if last else None]
    return lines


def test_code_on_a_page_fits_its_width():
    wide = []
    for page in pages():
        text = page.read_text()
        shown = [(name(page), line) for line in fenced_code_lines(text)]
        for target, options in INCLUDE.findall(text):
            shown.extend((f"{name(page)} ({target})", line) for line in included_lines(page, target, options))
        wide.extend(f"{where}: {line}" for where, line in shown if len(line) > WIDEST_CODE_LINE)
    assert wide == []


def test_the_width_check_reads_included_parts():
    page = DOCS / "index.md"
    assert fenced_code_lines("```python\nx = 1\n```\n```{toctree}\nlock-types\n```\n") == ["x = 1"]
    assert included_lines(page, "../pyproject.toml", ":start-after: [project]\n:end-before: [project.urls]\n")[0] == (
        'name = "dramatiq-unique"'
    )


def documentation_url() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["urls"]["Documentation"]


def anchors(page: Path) -> set[str]:
    """The anchors the site gives a page's headings (down to ###), as MyST makes them."""
    found = set()
    for line in prose_lines(page.read_text()):
        heading = re.match(r"^#{1,3} (.+)$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug)
    return found


def test_every_readme_link_works_on_github_and_on_pypi():
    # PyPI shows the README without the repository around it: a relative link is broken there,
    # and a link to a page of docs/ on GitHub shows the site's directives raw.
    readme = (ROOT / "README.md").read_text()
    site = documentation_url()
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    links = [target for _, target in LINK.findall(readme)] + URL.findall(readme)
    assert len(links) > 5
    broken = []
    for target in links:
        address, _, anchor = target.partition("#")
        if not address.startswith("https://"):
            broken.append(f"{target}: not an absolute https link")
        elif address.startswith(site):
            page = DOCS / (address.removeprefix(site).removesuffix(".html") or "index")
            source = page.with_suffix(".md")
            if not source.exists():
                broken.append(f"{target}: no page {name(source)}")
            elif anchor and anchor not in anchors(source):
                broken.append(f"{target}: no heading #{anchor} in {name(source)}")
        elif address.startswith(repository + "/blob/main/"):
            if not (ROOT / address.removeprefix(repository + "/blob/main/")).exists():
                broken.append(f"{target}: no such file in the repository")
    assert broken == []


def test_the_pages_the_package_points_to_exist():
    # The package's messages name pages of the site (a missing extra: its install section).
    from dramatiq_unique import links

    assert links.DOCS == documentation_url()
    address, _, anchor = links.EXTRAS.partition("#")
    source = (DOCS / address.removeprefix(links.DOCS).removesuffix(".html")).with_suffix(".md")
    assert anchor in anchors(source)


def test_the_project_names_its_license_and_its_addresses():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert set(project["urls"]) >= {"Documentation", "Repository", "Changelog", "Issues"}
    for license_file in project["license-files"]:
        assert (ROOT / license_file).read_text().strip()
    assert "GNU LESSER GENERAL PUBLIC LICENSE" in (ROOT / "LICENSE").read_text()
