"""``python -m gpumem.sim -- CMD``: run CMD on the simulated GPU (see gpumem.sim)."""

import sys

from gpumem.sim import main

sys.exit(main())
