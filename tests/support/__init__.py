"""Helpers shared by the test suite and the measuring tools (``benchmarks/``); not product code.

One copy of each, imported as ``tests.support`` (the repository root is on ``sys.path``:
pytest's ``pythonpath``, or ``python -m`` run from the root):

* :mod:`tests.support.fixtures` -- :data:`PALETTE`, :func:`free_port`, :func:`write_image`,
  :func:`draw_shape`, :func:`write_triplets` (a training triplet file over drawn shapes),
  :func:`triplet_rows` / :func:`write_rows` (benchmark rows and their solid-colour images).
* :mod:`tests.support.openai_stub` -- an OpenAI-compatible chat/completions server.
* :mod:`tests.support.http_images` -- colour squares served over HTTP and a triplet file of their URLs.
* :mod:`tests.support.batching_stub` -- the same answers from a server with a batch capacity,
  a queue and 429s beyond it, and counters of the capacity used.
* :mod:`tests.support.mlflow_server` -- a real ``mlflow server`` to crash and restart by PID.
* :mod:`tests.support.faults` -- step hooks that make a Ray Train worker fail once.
* ``house_stats.py`` -- the numbers the package's layout is judged by (a script).

Nothing here runs at import time.
"""
from tests.support.fixtures import (PALETTE, SHAPES, SYNONYMS, draw_shape, free_port, triplet_rows, write_image,
                                    write_rows, write_triplets)

__all__ = ["PALETTE", "SHAPES", "SYNONYMS", "draw_shape", "free_port", "triplet_rows", "write_image", "write_rows",
           "write_triplets"]
