#!/usr/bin/env python
"""`benchmark` stage entrypoint: `python jobs/benchmark.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos benchmark ...`; see `python jobs/benchmark.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["benchmark", *sys.argv[1:]]))
