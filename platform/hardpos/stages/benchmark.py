"""Performance harness: every stage's optimised path vs its naive baseline, side by side.

``python jobs/benchmark.py suite=<name>`` (or ``suite=all``) prints a Markdown table and
writes summary.json. Each suite alternates the two paths in one process and reports the
median ratio with min/max. Suites: text, train_step, evaluate, serve, generate, gpu (CUDA
only), resilience (node loss; figures, not ratios), tracking (step time with the MLflow
server dead vs alive). ``quick=true`` shrinks every suite to a smoke run. Reference files
(NegCLIP captions, REPLACE annotations) come from ``data_dir=`` or
``$HARDPOS_REFERENCE_DATA``; without either, suites use synthetic stand-ins.

The harness lives in :mod:`hardpos.perf.suites` (measuring tools are kept apart from the
product modules); this module registers it as the ``benchmark`` stage.
"""
from hardpos.perf.suites import Config, run

__all__ = ["Config", "run"]
