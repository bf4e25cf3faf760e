"""The README's commands work as written: every shell command it shows is extracted
and the checkable part checked, fast (nothing is run but config parsing and ``--help``):

* ``make X ...``: X is a Makefile target;
* ``python jobs/X.py ...``, ``hardpos X ...`` and the job inside ``ray job submit ... -- ...``:
  the entrypoint and stage exist, ``--config`` files exist, and the key=value overrides and
  flags parse into the stage's typed config (a renamed key fails here); ``hardpos track``
  answers ``--help``;
* ``pytest -m EXPR``: every marker in EXPR is registered; ``serve run FILE``: FILE exists;
  ``mlflow X``: X is an mlflow CLI command;
* relative links (``[text](docs/x.md)``) point at files that exist.

Commands come from fenced code blocks (untagged or bash/sh/shell/console; ``$ `` prompts,
``#`` comments and ``\\`` continuations handled) and from inline code spans, when they start
with one of :data:`COMMANDS`. Placeholder tokens (``<stage>``, ``key=value``, ``...``) are
left out of the checks; ``[--flag]`` brackets are read as the flag.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hardpos import cli
from hardpos.config import ConfigError, load_config
from hardpos.runtime import STAGES, stage_module

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMANDS = ("make", "python", "hardpos", "ray", "mlflow", "pytest", "serve")
SHELL_FENCES = ("", "bash", "sh", "shell", "console")
PLACEHOLDER_KEYS = {"key", "dotted.key", "k"}


# --------------------------------------------------------------------------- extraction
def _is_command(line: str) -> bool:
    return line.split(" ", 1)[0] in COMMANDS and " " in line


def fenced_commands(text: str) -> list[str]:
    """Command lines of the shell (or untagged) fenced blocks."""
    out, fence, buf = [], None, ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            continue
        if fence is None or fence not in SHELL_FENCES:
            continue
        line = re.sub(r"\s+#.*$", "", stripped.removeprefix("$ ")).strip()
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        line, buf = (buf + line).strip(), ""
        if not _quotes_closed(line):  # a quoted argument that goes on over the next line
            buf = line + " "
            continue
        if _is_command(line):
            out.append(line)
    return out


def _quotes_closed(line: str) -> bool:
    try:
        shlex.split(line)
    except ValueError:
        return False
    return True


def inline_commands(text: str) -> list[str]:
    """Inline code spans (``like this``, possibly wrapped over lines) that are commands."""
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    spans = (" ".join(m.split()) for m in re.findall(r"(?<!`)`([^`]+)`(?!`)", body))
    return [s for s in spans if _is_command(s)]


def readme_commands(text: str) -> list[str]:
    return list(dict.fromkeys(fenced_commands(text) + inline_commands(text)))


# --------------------------------------------------------------------------- checks
def _tokens(command: str) -> list[str]:
    """shlex tokens with ``[--flag]`` read as ``--flag`` and placeholders dropped (a
    placeholder may hold spaces: ``run_id=<child run id>`` is one token)."""
    command = re.sub(r"<[^<>]*>", lambda m: m.group(0).replace(" ", "_"), command)
    # an optional part ``[--flag]`` / ``[key=value ...]`` starts a word; ``key=[1, 2]`` is a YAML list
    command = re.sub(r"(^|\s)\[([^\[\]]*)\](?=\s|$)", r"\1 \2 ", command)
    tokens = shlex.split(command)
    keep = []
    for tok in tokens:
        if "<" in tok or ">" in tok or tok in ("...", "…") or tok.split("=", 1)[0] in PLACEHOLDER_KEYS:
            continue
        keep.append(tok)
    return keep


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m for line in text.splitlines() for m in re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line)}


def check_stage_args(stage: str, args: list[str]) -> list[str]:
    """Problems with ``hardpos <stage> args`` (empty: it parses into the stage's config)."""
    if stage not in STAGES:
        return [f"unknown stage {stage!r}"]
    try:
        config_file, overrides, _, _ = cli.parse_args(args)
        if config_file and not (ROOT / config_file).is_file():
            return [f"--config file {config_file} does not exist"]
        load_config(stage_module(stage).Config, ROOT / config_file if config_file else None, overrides)
    except ConfigError as exc:
        return [f"config error: {exc}"]
    return []


def check_command(command: str, targets: set[str] | None = None) -> list[str]:
    """Problems found in one README command (empty: fine, or nothing checkable here)."""
    tokens = _tokens(command)
    if not tokens:
        return []
    head, rest = tokens[0], tokens[1:]
    if head == "make":
        wanted = [t for t in rest if not t.startswith("-") and "=" not in t]
        known = make_targets() if targets is None else targets
        return [f"no make target {t!r}" for t in wanted if t not in known]
    if head == "ray":
        return check_command(" ".join(shlex.quote(t) for t in rest[rest.index("--") + 1:])) if "--" in rest else []
    if head == "python":
        if rest[:1] == ["-m"] and len(rest) > 1:
            return [] if module_answers_help(rest[1]) else [f"python -m {rest[1]}: no such module, or its --help fails"]
        if rest and rest[0].endswith(".py") and not rest[0].startswith("jobs/"):
            return [] if script_answers_help(rest[0]) else [f"{rest[0]}: missing, or its --help fails"]
        if not rest or not rest[0].startswith("jobs/"):
            return []
        script = rest[0]
        if not (ROOT / script).is_file():
            return [f"{script} does not exist"]
        return check_stage_args(Path(script).stem, rest[1:])
    if head == "hardpos":
        if not rest:
            return []
        if rest[0] == "track":
            return [] if cli.track_main(["--help"]) == 0 and rest[1:2] in ([], ["replay"]) else ["bad track command"]
        return check_stage_args(rest[0], rest[1:])
    if head == "pytest" and "-m" in rest:
        expr = rest[rest.index("-m") + 1]
        markers = set(re.findall(r"^\s*\"?([a-z_]+):", (ROOT / "pyproject.toml").read_text(), flags=re.M))
        words = set(re.findall(r"[a-z_]+", expr)) - {"not", "and", "or"}
        return [f"pytest marker {w!r} is not registered in pyproject.toml" for w in sorted(words - markers)]
    if head == "serve" and rest[:1] == ["run"]:
        return [f"{f} does not exist" for f in rest[1:2] if not (ROOT / f).is_file()]
    if head == "mlflow" and rest:
        import click
        from mlflow.cli import cli as mlflow_cli

        found = mlflow_cli.get_command(click.Context(mlflow_cli), rest[0])  # knows aliases (ui = server)
        return [] if found is not None else [f"mlflow has no command {rest[0]!r}"]
    return []


def module_answers_help(name: str) -> bool:
    """``python -m name`` exists in this checkout and, when its ``main`` knows ``--help``
    (HardPos's benchmark modules), ``main(["--help"])`` answers 0 in-process (prints only)."""
    import contextlib
    import importlib
    import importlib.util
    import io

    if importlib.util.find_spec(name) is None:
        return False
    module = importlib.import_module(name)
    main = getattr(module, "main", None)
    if main is None or '"--help"' not in Path(module.__file__).read_text():
        return True  # nothing that answers --help without running: existing is what can be checked
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return main(["--help"]) in (0, None)
        except SystemExit as exc:
            return exc.code in (0, None)


def script_answers_help(path: str) -> bool:
    """A ``python path.py`` script exists and ``--help`` exits 0 (run in-process, argparse)."""
    import contextlib
    import io
    import runpy
    import sys

    if not (ROOT / path).is_file():
        return False
    argv = sys.argv
    sys.argv = [str(ROOT / path), "--help"]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(ROOT / path), run_name="__main__")
    except SystemExit as exc:
        return exc.code in (0, None)
    finally:
        sys.argv = argv
    return True


def local_links(text: str) -> list[str]:
    """Relative link targets (no URL, no anchor-only) of the markdown ``text``."""
    return [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


# --------------------------------------------------------------------------- tests
def test_the_readme_shows_the_two_commands():
    commands = readme_commands(README.read_text())
    assert "make demo" in commands and "make test" in commands


def test_every_readme_command_checks_out():
    targets = make_targets()
    problems = {c: p for c in readme_commands(README.read_text()) if (p := check_command(c, targets))}
    assert problems == {}


DOCS = sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_in_the_docs_checks_out(doc, monkeypatch):
    """docs/*.md as README.md: every fenced or inline command parses into its stage's config
    (the --print-config form), or answers --help (benchmark modules, scripts), so a doc
    cannot drift from the code."""
    monkeypatch.chdir(ROOT)
    targets = make_targets()
    problems = {c: p for c in readme_commands(doc.read_text()) if (p := check_command(c, targets))}
    assert problems == {}
    missing = [t for t in local_links(doc.read_text()) if not (doc.parent / t).exists()]
    assert missing == []


def test_every_documented_stage_command_prints_its_config(monkeypatch, capsys):
    """The commands of README.md and docs/*.md that name a stage, run in-process as written
    with --print-config (what can run here in seconds: the command up to its compute)."""
    monkeypatch.chdir(ROOT)
    runs = 0
    for doc in [README, *DOCS]:
        for command in readme_commands(doc.read_text()):
            tokens = _tokens(command)
            if tokens[:1] == ["ray"] and "--" in tokens:
                tokens = tokens[tokens.index("--") + 1:]
            if tokens[:1] == ["python"] and tokens[1:2] and tokens[1].startswith("jobs/") and tokens[1] != "jobs/_bootstrap.py":
                stage, args = Path(tokens[1]).stem, tokens[2:]
            elif tokens[:1] == ["hardpos"] and tokens[1:2] and tokens[1] in STAGES:
                stage, args = tokens[1], tokens[2:]
            else:
                continue
            if "--help" in args or "-h" in args:
                continue
            code = cli.main([stage, *[a for a in args if a not in ("--full", "--from-scratch", "--verbose")], "--print-config"])
            assert code == 0, f"{doc.name}: {command}: {capsys.readouterr().err}"
            runs += 1
    assert runs >= 10


def test_every_relative_link_in_the_readme_exists():
    missing = [t for t in local_links(README.read_text()) if not (ROOT / t).exists()]
    assert missing == []


@pytest.mark.parametrize("stage", sorted({t for c in readme_commands(README.read_text())
                                          for t in re.findall(r"(?:jobs/|hardpos )([a-z_]+)", c) if t in STAGES}))
def test_the_readme_stages_answer_help(stage, capsys):
    assert cli.main([stage, "--help"]) == 0
    assert f"hardpos {stage}:" in capsys.readouterr().out


def test_the_checker_catches_renamed_keys_files_and_targets():
    """Each kind of stale README line fails (so a rename elsewhere fails this test file)."""
    text = "\n".join([
        "```bash",
        "$ make demoo",
        "python jobs/train.py --config jobs/configs/gone.yaml",
        "hardpos train loss.w_nag=0.5   # a typo",
        "```",
        "Run `python jobs/sweepp.py` or `ray job submit --working-dir . -- python jobs/demo.py pretrain.stepz=3`.",
        "```yaml",
        "make: not-a-command",
        "```",
    ])
    commands = readme_commands(text)
    assert commands == ["make demoo", "python jobs/train.py --config jobs/configs/gone.yaml",
                        "hardpos train loss.w_nag=0.5", "python jobs/sweepp.py",
                        "ray job submit --working-dir . -- python jobs/demo.py pretrain.stepz=3"]
    found = [check_command(c) for c in commands]
    assert found[0] == ["no make target 'demoo'"]
    assert found[1] == ["--config file jobs/configs/gone.yaml does not exist"]
    assert "loss.w_nag" in found[2][0] and found[3] == ["jobs/sweepp.py does not exist"]
    assert "pretrain.stepz" in found[4][0]
    # placeholders and optional brackets are read, not flagged
    assert check_command("python jobs/demo.py [key=value ...] [--full]") == []
    assert check_command("hardpos <stage> ...") == [] and check_command("make smoke PYTHON=python3.13 VENV=.venv-3.13") == []
    assert check_command("mlflow uii") == ["mlflow has no command 'uii'"]
    assert check_command('pytest -m "not gpu and not slowest"') == ["pytest marker 'slowest' is not registered in pyproject.toml"]
