"""Measuring tools for HardPos: they run the product, they are not part of it.

Moved out of the product modules in issue 16 (they were ~2,200 of the package's lines and
reached outside it: a test file loaded by path, import-path edits, a data folder guessed
next to the repository, ``os.environ`` changed for the caller):

* :mod:`hardpos.perf.harness` -- alternating A/B timing, the results table, and
  :func:`~hardpos.perf.harness.reference_data_dir` (``data_dir=`` / ``$HARDPOS_REFERENCE_DATA``).
* :mod:`hardpos.perf.suites` -- the ``benchmark`` stage's suites (``hardpos benchmark``).
* :mod:`hardpos.perf.train_bench`, :mod:`hardpos.perf.eval_bench`,
  :mod:`hardpos.perf.generate_bench` -- per-stage measurements the suites call.
* :mod:`hardpos.perf.tracking_bench` -- the training step with the MLflow server dead vs alive.
* :mod:`hardpos.perf.loadgen` -- the loopback-only load generator for the Serve app.
* :mod:`hardpos.perf.resilience` -- node-loss fault injection on a simulated cluster.
* :mod:`hardpos.perf.calibrate` -- the synthetic world's probe and the demo over seeds.

Shared test data helpers and the OpenAI-compatible stub are in :mod:`hardpos.testing`.
Importing this package imports nothing heavy.
"""
