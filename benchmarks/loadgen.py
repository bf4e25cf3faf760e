"""The load generator's command line: a bounded, loopback-only HTTP load test of the scoring service.

    python -m benchmarks.loadgen                                  # compare_servers, defaults
    python -m benchmarks.loadgen "concurrency=[1,8,32]" requests_per_level=300
    python -m benchmarks.loadgen arch=ViT-B-32 "targets=[batched,unbatched,plain]" repeats=2
    python -m benchmarks.loadgen url=http://127.0.0.1:8000 token_env=HARDPOS_SERVE_TOKEN

With ``url`` it measures that running server (:func:`measure`); without, it deploys the
Ray Serve app batched and unbatched and the plain FastAPI + uvicorn peer side by side on
this machine and compares them (:func:`compare_servers`). Prints a Markdown table, then the
JSON. The client side (settings, payloads, levels, figures) is
:mod:`benchmarks.load_client`, deploying and comparing is :mod:`benchmarks.serve_compare`;
their public names are importable from here too.

Safety: only loopback URLs are accepted (127.0.0.0/8, ::1, localhost), every level is
bounded in requests and seconds, and the whole run in seconds (``max_total_s``).
"""
from __future__ import annotations

import json
import sys

from benchmarks.harness import run_cli
from benchmarks.load_client import (
    HARD_MAX_REQUESTS,
    HARD_MAX_SECONDS,
    LoadgenConfig,
    check_loopback,
    make_payloads,
    measure,
    measure_level,
    percentile,
    summarize,
)
from benchmarks.serve_compare import (
    compare_batching,
    compare_servers,
    format_report,
    level_report,
    ray_worker_niceness,
    serve_bench,
    start_plain,
    stop_plain,
)

__all__ = ["HARD_MAX_REQUESTS", "HARD_MAX_SECONDS", "LoadgenConfig", "check_loopback", "compare_batching",
           "compare_servers", "format_report", "level_report", "main", "make_payloads", "measure", "measure_level",
           "percentile", "ray_worker_niceness", "serve_bench", "start_plain", "stop_plain", "summarize"]


def main(argv: list[str] | None = None) -> int:
    """``key=value`` arguments of :class:`LoadgenConfig`; exit 2 on a bad config or URL."""
    def run(cfg: LoadgenConfig) -> int:
        if cfg.url:
            try:
                check_loopback(cfg.url)
            except ValueError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        result = measure(cfg) if cfg.url else compare_servers(cfg)
        print(format_report(result))
        print(json.dumps(result, indent=2))
        return 0

    return run_cli(LoadgenConfig, argv, run)


if __name__ == "__main__":
    raise SystemExit(main())
