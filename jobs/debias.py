#!/usr/bin/env python
"""`debias` stage entrypoint: `python jobs/debias.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos debias ...`; see `python jobs/debias.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["debias", *sys.argv[1:]]))
