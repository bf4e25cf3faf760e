#!/usr/bin/env python
"""`interpolate` stage entrypoint: `python jobs/interpolate.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos interpolate ...`; see `python jobs/interpolate.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["interpolate", *sys.argv[1:]]))
