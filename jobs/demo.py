#!/usr/bin/env python
"""`demo` stage entrypoint: `python jobs/demo.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos demo ...`; see `python jobs/demo.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
