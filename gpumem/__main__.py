"""``python -m gpumem``: the gpumem command line (see gpumem.cli)."""

import sys

from gpumem.cli import main

sys.exit(main())
