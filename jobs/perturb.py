#!/usr/bin/env python
"""`perturb` stage entrypoint: `python jobs/perturb.py [--config FILE.yaml] [key=value ...]`.

Same as `hardpos perturb ...`; see `python jobs/perturb.py --help` for the config keys.
"""
import sys

import _bootstrap  # noqa: F401  (source-tree fallback for hardpos)
from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main(["perturb", *sys.argv[1:]]))
