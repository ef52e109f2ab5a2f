"""``python -m dramatiq_unique``: the ``dramatiq-unique`` command."""

import sys

from .cli import main

sys.exit(main())
