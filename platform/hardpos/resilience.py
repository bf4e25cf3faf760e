"""Alias of :mod:`hardpos.perf.resilience`, so ``python -m hardpos.resilience OUT [--quick]``
keeps working after the fault-injection run moved out of the product modules."""
import sys

from hardpos.perf.resilience import *  # noqa: F401,F403  (the public names, for old imports)
from hardpos.perf.resilience import main

if __name__ == "__main__":
    sys.exit(main())
