"""Test and benchmark helpers shared by the test suite and :mod:`hardpos.perf` (not product code).

Before this package existed the same helpers were copied into the tests, the resilience run
and the benchmarks, and had drifted apart (three colour palettes with different greens, four
``write_triplets``). Now there is one of each:

* :mod:`hardpos.testing.fixtures` -- :data:`PALETTE`, :func:`free_port`, :func:`write_image`,
  :func:`draw_shape`, :func:`write_triplets` (a training triplet file over drawn shapes),
  :func:`triplet_rows` / :func:`write_rows` (benchmark rows and their solid-colour images).
* :mod:`hardpos.testing.openai_stub` -- an OpenAI-compatible chat/completions server.
* :mod:`hardpos.testing.mlflow_server` -- a real ``mlflow server`` to crash and restart by PID.

Nothing here runs at import time, and nothing here reads outside the package.
"""
from hardpos.testing.fixtures import (PALETTE, SHAPES, SYNONYMS, draw_shape, free_port, triplet_rows, write_image,
                                      write_rows, write_triplets)

__all__ = ["PALETTE", "SHAPES", "SYNONYMS", "draw_shape", "free_port", "triplet_rows", "write_image", "write_rows",
           "write_triplets"]
