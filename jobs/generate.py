#!/usr/bin/env python
"""`generate` stage entrypoint: `python jobs/generate.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos generate ...`; see `python jobs/generate.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
