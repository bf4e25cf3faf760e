#!/usr/bin/env python
"""`evaluate` stage entrypoint: `python jobs/evaluate.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos evaluate ...`; see `python jobs/evaluate.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["evaluate", *sys.argv[1:]]))
