"""Sphinx configuration of the dramatiq-unique documentation site (`make docs`)."""

import ast
import importlib
import importlib.util
import logging
import pkgutil
import sys
from pathlib import Path

from sphinx.application import Sphinx

DOCS = Path(__file__).resolve().parent

# The package of this checkout, not an installed copy, is the one documented.
sys.path.insert(0, str(DOCS.parent))
# Extensions of this site.
sys.path.insert(0, str(DOCS / "_ext"))

import dramatiq_unique  # noqa: E402

project = "dramatiq-unique"
author = "the dramatiq-unique authors"
copyright = "the dramatiq-unique authors"
version = release = dramatiq_unique.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinxarg.ext",
    "parser_epilog",
]
# The timeline pictures of the lock types are drawn at build time by docs/_ext/timelines.py.
if (DOCS / "_ext" / "timelines.py").exists():
    extensions.append("timelines")

exclude_patterns = ["_build", "README.md"]
root_doc = "index"
language = "en"

# Pages are Markdown. Links such as [Lock types](lock-types.md#lapsed-locks) name
# headings by their anchors, so headings down to ### get one.
source_suffix = {".md": "markdown"}
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# Curly quotes and ellipses, but "--" stays two hyphens: option names are written in running text.
smartquotes_action = "qe"

html_theme = "furo"
html_title = f"dramatiq-unique {release}"

# API reference: signatures without the types, which are listed with each parameter.
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# The package imports some of the names of its annotations for type checking only
# (``if TYPE_CHECKING:``), so autodoc could not evaluate them and would show them as
# unlinked strings. Run those imports into the modules here, for the documentation only.
_RUNTIME_STANDINS = {"_typeshed.wsgi": "wsgiref.types"}


def _import_type_checking_names() -> None:
    for module_info in pkgutil.walk_packages(dramatiq_unique.__path__, "dramatiq_unique."):
        if module_info.name.endswith(".__main__"):
            continue
        module = importlib.import_module(module_info.name)
        for node in ast.walk(ast.parse(Path(module.__file__ or "").read_text())):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                for statement in node.body:
                    if isinstance(statement, ast.ImportFrom):
                        source = importlib.util.resolve_name(
                            "." * statement.level + (statement.module or ""), module.__package__
                        )
                        imported = importlib.import_module(_RUNTIME_STANDINS.get(source, source))
                        for alias in statement.names:
                            vars(module).setdefault(alias.asname or alias.name, getattr(imported, alias.name))


_import_type_checking_names()

# Types of the package's inner workings that public signatures hand around but users never
# build or call: they are shown by name, without a link.
nitpick_ignore = [
    ("py:class", "dramatiq_unique.events.Events"),
    ("py:class", "Events"),
    ("py:class", "dramatiq_unique.events.EventSubject"),
    ("py:class", "EventSubject"),
    ("py:class", "dramatiq_unique.liveness.Liveness"),
    ("py:class", "Liveness"),
    # prometheus_client publishes no Sphinx inventory.
    ("py:class", "prometheus_client.registry.CollectorRegistry"),
    ("py:class", "prometheus_client.CollectorRegistry"),
]

# Links to the documentation of Python, Dramatiq and redis-py. This machine and CI cannot download
# their inventories at build time, so they are kept in docs/_inventories/: see docs/README.md
# for how they were made and how to refresh them.
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", str(DOCS / "_inventories" / "python.inv")),
    "dramatiq": ("https://dramatiq.io/", str(DOCS / "_inventories" / "dramatiq.inv")),
    "redis": ("https://redis.readthedocs.io/en/stable/", str(DOCS / "_inventories" / "redis.inv")),
}


class _EmptyGlobs(logging.Filter):
    """The catch-all globs of the toctrees (docs/index.md, docs/use-cases/index.md) are where new
    pages slot in; one that matches nothing yet is no mistake. Sphinx gives this warning no type
    that ``suppress_warnings`` could name."""

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "subtype", None) != "empty_glob"


def setup(app: Sphinx) -> None:
    logging.getLogger("sphinx.sphinx.directives.other").addFilter(_EmptyGlobs())
