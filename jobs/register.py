#!/usr/bin/env python
"""`register` stage entrypoint: `python jobs/register.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos register ...`; see `python jobs/register.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["register", *sys.argv[1:]]))
