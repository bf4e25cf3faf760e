#!/usr/bin/env python
"""`audit` stage entrypoint: `python jobs/audit.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos audit ...`; see `python jobs/audit.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["audit", *sys.argv[1:]]))
