#!/usr/bin/env python
"""`train` stage entrypoint: `python jobs/train.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos train ...`; see `python jobs/train.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
