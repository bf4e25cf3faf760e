"""Alias of :mod:`hardpos.perf.calibrate`, so ``python -m hardpos.calibrate probe|seeds ...``
keeps working after the calibration tool moved out of the product modules."""
import sys

from hardpos.perf.calibrate import *  # noqa: F401,F403  (the public names, for old imports)
from hardpos.perf.calibrate import main

if __name__ == "__main__":
    sys.exit(main())
