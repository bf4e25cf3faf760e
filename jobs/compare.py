#!/usr/bin/env python
"""`compare` stage entrypoint: `python jobs/compare.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos compare ...`; see `python jobs/compare.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["compare", *sys.argv[1:]]))
