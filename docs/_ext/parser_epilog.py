"""The ``parser-epilog`` directive: the epilog of an argparse parser, as ``--help`` prints it.

sphinx-argparse renders an epilog as running text, which loses the line breaks of its examples
and exit codes; this shows it as a literal block instead::

    ```{parser-epilog} dramatiq_unique.cli:make_argument_parser
    ```
"""

import importlib

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective


class ParserEpilog(SphinxDirective):
    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name, _, function = self.arguments[0].partition(":")
        epilog = getattr(importlib.import_module(module_name), function)().epilog or ""
        block = nodes.literal_block(epilog, epilog)
        block["language"] = "text"
        return [block]


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("parser-epilog", ParserEpilog)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
