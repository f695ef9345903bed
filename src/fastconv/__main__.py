"""``python -m fastconv``: the same as the ``fastconv`` command."""

import sys

from .tools.cli import main

sys.exit(main())
