"""Measuring tools for HardPos: they run the product, they are not part of it.

Kept apart from the product modules (they would otherwise reach outside the package: a
test file loaded by path, import-path edits, a data folder guessed next to the repository,
``os.environ`` changed for the caller):

* :mod:`hardpos.perf.harness` -- alternating A/B timing, the results table, and
  :func:`~hardpos.perf.harness.reference_data_dir` (``data_dir=`` / ``$HARDPOS_REFERENCE_DATA``).
* :mod:`hardpos.perf.suites` -- the ``benchmark`` stage's suites (``hardpos benchmark``).
* :mod:`hardpos.perf.train_bench`, :mod:`hardpos.perf.eval_bench`,
  :mod:`hardpos.perf.generate_bench` -- per-stage measurements the suites call.
* :mod:`hardpos.perf.tracking_bench` -- the training step with the MLflow server dead vs alive.
* :mod:`hardpos.perf.loadgen` -- the loopback-only load generator for the Serve app
  (:mod:`~hardpos.perf.load_client`: the client; :mod:`~hardpos.perf.serve_compare`: Serve
  batched / unbatched / colocated vs the plain FastAPI + uvicorn peer, side by side).
* :mod:`hardpos.perf.gpu_standalone` -- the GPU figures with torch + open_clip alone (no Ray,
  no MLflow: what the lent GPU machine can run).
* :mod:`hardpos.perf.scaling` -- each stage at three sizes: throughput and peak memory per size.
* :mod:`hardpos.perf.inputs` -- training-input layouts (image files, inline parquet, webdataset).
* :mod:`hardpos.perf.resilience` -- node-loss fault injection on a simulated cluster
  (:mod:`~hardpos.perf.simcluster`).
* :mod:`hardpos.perf.calibrate` -- the synthetic world's probe and the demo over seeds;
  :mod:`hardpos.perf.calibrate_relations` -- can a model learn the world's relations at all
  (relation-only training, REPLACE-relation accuracy every N steps).

Shared test data helpers and the OpenAI-compatible stub are in :mod:`hardpos.testing`.
Importing this package imports nothing heavy.
"""
