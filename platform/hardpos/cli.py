"""``hardpos <stage> [--config FILE.yaml] [dotted.key=value ...]`` -> the stage's job.

``jobs/<stage>.py`` calls the same :func:`main`, so ``ray job submit -- python
jobs/train.py ...`` and ``hardpos train ...`` are one code path.

Exit codes: 0 success, 1 the stage failed, 2 bad command line or configuration.
"""
from __future__ import annotations

import dataclasses
import sys
import typing

from hardpos.config import ConfigError, dump_yaml, load_config
from hardpos.runtime import STAGES, execute, stage_module

USAGE = f"""usage: hardpos <stage> [--config FILE.yaml] [dotted.key=value ...] [--print-config] [--help]

stages: {', '.join(STAGES)}

  --config FILE     YAML file with any subset of the stage's config keys
  key=value         override one key (dotted for sections), value parsed as YAML
  --flag            shorthand for flag=true (boolean keys, e.g. demo --full)
  --print-config    print the resolved config as YAML and exit
  --help            list the stage's config keys with their types and defaults
"""


def describe_config(cls: type, prefix: str = "") -> list[str]:
    """One line per config key: ``name: type = default``, recursing into sections."""
    lines = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        tp = hints[field.name]
        name = f"{prefix}{field.name}"
        if dataclasses.is_dataclass(tp):
            lines.extend(describe_config(tp, prefix=f"{name}."))
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = field.default_factory()  # type: ignore[misc]
        else:
            default = "<required>"
        tp_name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        lines.append(f"  {name}: {tp_name} = {default!r}")
    return lines


def parse_args(argv: list[str]) -> tuple[str | None, list[str], bool, bool]:
    config_file, overrides, print_config, want_help = None, [], False, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            want_help = True
        elif arg == "--print-config":
            print_config = True
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
    if stage not in STAGES:
        print(f"hardpos: unknown stage {stage!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    module = stage_module(stage)
    try:
        config_file, overrides, print_config, want_help = parse_args(rest)
        if want_help:
            doc = (module.__doc__ or "").strip()
            print(f"hardpos {stage}: {doc}\n\nconfig keys:\n" + "\n".join(describe_config(module.Config)))
            return 0
        cfg = load_config(module.Config, config_file, overrides)
    except ConfigError as exc:
        print(f"hardpos {stage}: config error: {exc}", file=sys.stderr)
        return 2
    if print_config:
        print(dump_yaml(cfg))
        return 0
    try:
        summary = execute(stage, cfg)
    except KeyboardInterrupt:
        print(f"hardpos {stage}: interrupted", file=sys.stderr)
        return 130
    except ConfigError as exc:  # raised by a stage validating its inputs before work starts
        print(f"hardpos {stage}: config error: {exc}", file=sys.stderr)
        return 2
    return 0 if summary.get("status") == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
