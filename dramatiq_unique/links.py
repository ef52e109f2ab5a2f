"""The pages of the documentation that the package's messages point a person to."""

#: The documentation site.
DOCS = "https://dramatiq-unique.readthedocs.io/en/latest/"
#: How to install the package with an extra (the ``web``, ``prometheus`` extras...).
EXTRAS = DOCS + "getting-started.html#extras"
