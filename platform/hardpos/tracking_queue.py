"""Deprecated alias: the tracking queue now lives in the :mod:`hardpos.tracking` package
(``queue``, ``transport``, ``files``, ``replay``); import from ``hardpos.tracking``.

Kept only while modules being restructured still import it; remove it once nothing does
(``grep -rn tracking_queue platform jobs serve tests``).
"""
from hardpos.tracking import *  # noqa: F401,F403
from hardpos.tracking import __all__  # noqa: F401
