"""Make ``hardpos`` importable when the package is not installed (e.g. a bare
``ray job submit --working-dir .`` on a cluster image without HardPos): fall back to
the source tree's ``platform/`` folder. Installed copies always win."""
import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("hardpos") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "platform"))
