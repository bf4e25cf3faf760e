#!/usr/bin/env python
"""`sweep` stage entrypoint: `python jobs/sweep.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos sweep ...`; see `python jobs/sweep.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
