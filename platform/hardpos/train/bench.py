"""Alias of :mod:`hardpos.perf.train_bench` (where the training-step benchmarks moved in issue 16).

Kept only while ``hardpos.tracking_bench`` still imports ``_batch`` from here; remove it when
that module moves into :mod:`hardpos.perf` too.
"""
from hardpos.perf.train_bench import _batch, bench_train_step

__all__ = ["_batch", "bench_train_step"]
