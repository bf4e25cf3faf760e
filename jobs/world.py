#!/usr/bin/env python
"""`world` stage entrypoint: `python jobs/world.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos world ...`; see `python jobs/world.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["world", *sys.argv[1:]]))
