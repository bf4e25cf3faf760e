"""Alias of :mod:`hardpos.perf.harness` (where the alternating-timing helpers moved in issue 16).

Kept only while ``hardpos.tracking_bench`` still imports it from here; remove it when that
module moves into :mod:`hardpos.perf` too.
"""
from hardpos.perf.harness import compare_alternating, format_table, time_call

__all__ = ["compare_alternating", "format_table", "time_call"]
