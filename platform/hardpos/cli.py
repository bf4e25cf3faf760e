"""``hardpos <stage> [--config FILE.yaml] [dotted.key=value ...]`` -> the stage's job.

``jobs/<stage>.py`` calls the same :func:`main`, so ``ray job submit -- python
jobs/train.py ...`` and ``hardpos train ...`` are one code path.

``hardpos track replay <dir> [--tracking-uri URI]`` sends tracking records a job could not
deliver (summary.json's ``tracking`` section names them) to their MLflow runs.

Exit codes: 0 success, 1 the stage failed (or records are still undelivered), 2 bad command
line or configuration.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any

from hardpos import tracking
from hardpos.config import ConfigError, describe_config, dump_yaml, load_config, to_dict
from hardpos.runtime import STAGES, execute, stage_module
from hardpos.tracking import TrackingUnavailableError
from hardpos.tracking.redact import redact, redact_text

USAGE = f"""usage: hardpos <stage> [--config FILE.yaml] [dotted.key=value ...] [--verbose] [--print-config] [--help]

stages: {', '.join(STAGES)}

  --config FILE     YAML file with any subset of the stage's config keys
  key=value         override one key (dotted for sections), value parsed as YAML
  --flag            shorthand for flag=true (boolean keys, e.g. demo --full)
  -v, --verbose     same as log_level=debug: Ray's own logs, warnings and progress bars
                    too (by default the console shows HardPos's stage, progress and result lines)
  --print-config    print the resolved config as YAML and exit
  --help            list the stage's config keys: type, the stage's default (or the value
                    --config/overrides give), allowed values and doc

       hardpos track replay <dir|file> [--tracking-uri URI]
                    send the tracking records a job could not deliver (the files named in
                    its summary.json, under <output_dir>/tracking) to their MLflow runs
"""

TRACK_USAGE = """usage: hardpos track replay <dir|file> [--tracking-uri URI]

Sends every *.undelivered.jsonl under <dir> (a job's <output_dir>/tracking, or any folder
above it) to its MLflow run, oldest record first; a run recorded locally because the server
was down at the start is created first. Files that went through are deleted; the others keep
what is left. --tracking-uri overrides the URI each file names (the server moved).
"""


def track_main(argv: list[str]) -> int:
    """``hardpos track replay ...``: 0 when everything was delivered, 1 when some records are left."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(TRACK_USAGE)
        return 0 if args else 2
    if args[0] != "replay":
        print(f"hardpos track: unknown command {args[0]!r}\n\n{TRACK_USAGE}", file=sys.stderr)
        return 2
    paths, uri = [], None
    rest = args[1:]
    while rest:
        arg = rest.pop(0)
        if arg == "--tracking-uri" and rest:
            uri = rest.pop(0)
        elif arg.startswith("--tracking-uri="):
            uri = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            print(f"hardpos track replay: unknown option {arg!r}\n\n{TRACK_USAGE}", file=sys.stderr)
            return 2
        else:
            paths.append(arg)
    if len(paths) != 1:
        print(f"hardpos track replay: give one folder or file\n\n{TRACK_USAGE}", file=sys.stderr)
        return 2
    try:
        report = tracking.replay(paths[0], tracking_uri=uri)
    except (FileNotFoundError, ValueError) as exc:
        print(f"hardpos track replay: {exc}", file=sys.stderr)
        return 2
    runs = ", ".join(f"{a} -> {b}" if a != b else a for a, b in report.runs.items()) or "none"
    print(f"replayed {report.files} file(s): {report.delivered} record(s) delivered, {report.rejected} refused by "
          f"the server, {report.left} left; runs: {runs}")
    for error in report.errors:
        print(f"  {error}", file=sys.stderr)
    return 0 if report.left == 0 and not report.errors else 1


def help_text(stage: str, module: Any, cfg: Any, config_file: str | None, overrides: list[str]) -> str:
    """The stage's doc, then every config key with its type, its value in ``cfg`` (the
    stage's real defaults; with --config/overrides, theirs), its choices and its doc."""
    doc = (module.__doc__ or "").strip()
    source = "the stage's defaults" + (f" + {config_file}" if config_file else "") + (" + overrides" if overrides else "")
    return (f"hardpos {stage}: {doc}\n\nusage: hardpos {stage} [--config FILE.yaml] [dotted.key=value ...] "
            f"[--print-config]\n\nconfig keys (values: {source}; list items by index, e.g. key.0.field=...):\n"
            + "\n".join(describe_config(cfg)))


def parse_args(argv: list[str]) -> tuple[str | None, list[str], bool, bool]:
    config_file, overrides, print_config, want_help = None, [], False, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            want_help = True
        elif arg == "--print-config":
            print_config = True
        elif arg in ("-v", "--verbose"):
            overrides.append("log_level=debug")  # Ray's own logs and progress bars back
        elif arg == "--config":
            if not args:
                raise ConfigError("--config needs a file path")
            config_file = args.pop(0)
        elif arg.startswith("--config="):
            config_file = arg.split("=", 1)[1]
        elif arg.startswith("--") and "=" in arg:
            overrides.append(arg[2:])  # tolerate --key=value
        elif arg.startswith("--") and len(arg) > 2:
            overrides.append(f"{arg[2:].replace('-', '_')}=true")  # --full -> full=true (bool keys)
        elif arg.startswith("-"):
            raise ConfigError(f"unknown option {arg!r}")
        else:
            overrides.append(arg)
    return config_file, overrides, print_config, want_help


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    stage, rest = argv[0], argv[1:]
    if stage == "track":
        return track_main(rest)
    if stage not in STAGES:
        print(f"hardpos: unknown stage {stage!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    module = stage_module(stage)
    try:
        config_file, overrides, print_config, want_help = parse_args(rest)
        cfg = load_config(module.Config, config_file, overrides)
        if want_help:
            print(help_text(stage, module, cfg, config_file, overrides))
            return 0
    except ConfigError as exc:
        print(f"hardpos {stage}: config error: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    if print_config:
        print(dump_yaml(redact(to_dict(cfg))))
        return 0
    verbose = cfg.log_level == "debug"
    try:
        # execute runs the stage's check (inputs, servers, weights) before anything is started
        # or written: a user's mistake costs seconds and one line, not a traceback.
        summary = execute(stage, cfg)
    except KeyboardInterrupt:
        print(f"hardpos {stage}: interrupted", file=sys.stderr)
        return 130
    except ConfigError as exc:  # the stage's check, or the stage validating its inputs before work starts
        if verbose:
            traceback.print_exc()
        print(f"hardpos {stage}: {redact_text(str(exc))}", file=sys.stderr)
        return 2
    except TrackingUnavailableError as exc:  # before any compute: one line, no traceback
        print(f"hardpos {stage}: {redact_text(str(exc))}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - the stage failed: one line; --verbose gives the traceback
        if verbose:
            raise
        first = (redact_text(str(exc)).strip().splitlines() or [""])[0][:500]
        print(f"hardpos {stage}: failed: {type(exc).__name__}: {first} (--verbose shows the traceback)",
              file=sys.stderr)
        return 1
    return 0 if summary.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
