"""``python -m hardpos <stage> [--config FILE.yaml] [key=value ...]``: the same CLI as the
``hardpos`` console script (:func:`hardpos.cli.main`)."""
import sys

from hardpos.cli import main

if __name__ == "__main__":
    sys.exit(main())
