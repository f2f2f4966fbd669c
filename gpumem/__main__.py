"""``python -m gpumem``: the gpumem command line (see gpumem.cli)."""

import sys

from .cli import main

sys.exit(main())
