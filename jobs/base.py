#!/usr/bin/env python
"""`base` stage entrypoint: `python jobs/base.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos base ...`; see `python jobs/base.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["base", *sys.argv[1:]]))
