"""Side-by-side timing: an optimised path and its naive baseline, alternated in one process.

Why alternate: on a shared 2-core machine, background load drifts over seconds; running
A, B, A, B, ... and taking the median of the per-pair ratios cancels most of that drift,
where "all of A then all of B" would not.  Never used in tests as a timing assertion.

:func:`reference_data_dir` is the one place the suites learn where
the public reference files are; the package never guesses a path outside itself.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from hardpos.config import ConfigError, load_config
from hardpos.markdown import table

REFERENCE_DATA_ENV = "HARDPOS_REFERENCE_DATA"


def run_cli(config_cls: type, argv: list[str] | None, run: Callable[[Any], int | None]) -> int:
    """A measuring tool's command line: ``-h``/``--help`` prints ``config_cls``'s docstring
    (exit 0); ``key=value`` arguments load a ``config_cls`` (a bad one: ``error: ...`` on stderr,
    exit 2, before anything starts); then ``run(config)``'s exit code (None: 0)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(config_cls.__doc__)
        return 0
    try:
        cfg = load_config(config_cls, None, argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(cfg) or 0


def reference_data_dir(explicit: str | os.PathLike | None = None) -> Path | None:
    """The folder holding the public reference files the suites measure on
    (``negclip/valid_neg_clip.tsv``, ``hard_positives/``, ...).

    ``explicit`` (a ``data_dir=`` key or argument) wins; else ``$HARDPOS_REFERENCE_DATA``
    (``$HARDPOS_SHARED_DATA``, the name the test suite reads, is accepted too); else None,
    and the suites fall back to synthetic stand-ins and say so in their rows. The folder is
    returned whether or not it exists: callers decide if absence is an error (explicit) or
    a fallback (environment).
    """
    value = explicit or os.environ.get(REFERENCE_DATA_ENV) or os.environ.get("HARDPOS_SHARED_DATA")
    return Path(value).expanduser() if value else None


def time_call(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def compare_alternating(
    optimised: Callable[[], Any],
    baseline: Callable[[], Any],
    *,
    repeats: int = 5,
    warmup: int = 1,
    work_items: int | None = None,
) -> dict[str, Any]:
    """Time ``optimised`` and ``baseline`` alternately; ratio = baseline_time / optimised_time.

    Returns medians (seconds), the median/min/max speed-up ratio over the pairs, and when
    ``work_items`` is given, items/s of each path.
    """
    for _ in range(warmup):
        optimised()
        baseline()
    fast, slow = [], []
    for i in range(repeats):
        # Swap the order every other pair so neither path always runs "second".
        if i % 2 == 0:
            fast.append(time_call(optimised))
            slow.append(time_call(baseline))
        else:
            slow.append(time_call(baseline))
            fast.append(time_call(optimised))
    ratios = [s / f for f, s in zip(fast, slow) if f > 0]
    out: dict[str, Any] = {
        "optimised_s": statistics.median(fast),
        "baseline_s": statistics.median(slow),
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "repeats": repeats,
    }
    if work_items:
        out["optimised_items_per_s"] = work_items / out["optimised_s"]
        out["baseline_items_per_s"] = work_items / out["baseline_s"]
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of benchmark rows (suite, case, optimised, baseline, ratio)."""
    cells = []
    for row in rows:
        if "ratio_median" in row:
            ratio = f"{row['ratio_median']:.2f}x [{row['ratio_min']:.2f}, {row['ratio_max']:.2f}]"
            opt, base = _fmt_time(row.get("optimised_s")), _fmt_time(row.get("baseline_s"))
        else:
            ratio, opt, base = "-", _fmt_value(row.get("value")), "-"
        cells.append([row.get("suite", ""), row.get("case", ""), opt, base, ratio])
    return table(["suite", "case", "optimised", "baseline", "speed-up (median [min, max])"], cells)


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value) if value is not None else "-"
