"""Measuring tools for HardPos: they run the product, they are not part of it.

Run from the repository root, each as ``python -m benchmarks.<tool> ...`` (HardPos installed,
e.g. ``make install``; the load generator also needs the ``bench`` extra). They are not in the
installed ``hardpos`` package:

* :mod:`benchmarks.suites` -- every stage's optimised path vs its naive baseline, side by side
  (``python -m benchmarks.suites suite=<name>|all``).
* :mod:`benchmarks.harness` -- alternating A/B timing, the results table, and
  :func:`~benchmarks.harness.reference_data_dir` (``data_dir=`` / ``$HARDPOS_REFERENCE_DATA``).
* :mod:`benchmarks.train_bench`, :mod:`benchmarks.eval_bench`,
  :mod:`benchmarks.generate_bench` -- per-stage measurements the suites call.
* :mod:`benchmarks.tracking_bench` -- the training step with the MLflow server dead vs alive.
* :mod:`benchmarks.loadgen` -- the loopback-only load generator for the Serve app
  (:mod:`~benchmarks.load_client`: the client; :mod:`~benchmarks.serve_compare`: Serve
  batched / unbatched / colocated vs the plain FastAPI + uvicorn peer,
  :mod:`~benchmarks.plain_server`, side by side); :mod:`benchmarks.serve_overhead` -- what
  Serve adds to every request, one do-nothing handler in a replica vs plain uvicorn.
* :mod:`benchmarks.gpu_standalone` -- the GPU figures with torch + open_clip alone (no Ray,
  no MLflow: what a bare GPU machine can run).
* :mod:`benchmarks.scaling` -- each stage at three sizes: throughput and peak memory per size.
* :mod:`benchmarks.inputs` -- training-input layouts (image files, inline parquet, webdataset).
* :mod:`benchmarks.resilience` -- node-loss fault injection on a simulated cluster
  (:mod:`~benchmarks.simcluster`).
* :mod:`benchmarks.calibrate` -- the demo over seeds, checkpoints rescored by the evaluate
  stage, and the preregistered checks on a measurement; :mod:`benchmarks.confirmatory` -- the
  preregistered confirmatory experiment (its worlds and its one report);
  :mod:`benchmarks.calibrate_artefacts` -- how far text alone tells captions from negatives.

Shared test data helpers and the OpenAI-compatible stub are in ``tests/support``.
Importing this package imports nothing heavy.
"""
from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder that holds ``benchmarks/``).
REPO = Path(__file__).resolve().parent.parent


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment (plus ``extra``) with the repository root first on
    ``PYTHONPATH``, so a child ``python -m benchmarks.<tool>`` imports from any folder."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env
