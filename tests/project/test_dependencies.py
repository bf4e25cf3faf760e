"""Every third-party module HardPos imports is a declared requirement of its own (not left
to arrive through another package's requirements): the installed package's imports in
``[project.dependencies]`` (``vllm`` in its extra), the repository's tooling -- the measuring
tools (``benchmarks/``) and the test helpers (``tests/support/``) -- in an extra. Pure
``ast`` over the source."""
from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "platform" / "hardpos"
#: Folders (relative to the repository) of tooling: not installed, run from the repository.
TOOLING = ("benchmarks/", "tests/support/")
FIRST_PARTY = ("hardpos", "benchmarks", "tests", "__future__")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda req: _norm(re.split(r"[\s<>=!~\[;]", req, maxsplit=1)[0])  # noqa: E731
    core = {name(r) for r in project["dependencies"]}
    extras = {k: {name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    return core, extras


def _sources() -> list[Path]:
    """The product's modules, then the tooling's."""
    return [*PACKAGE.rglob("*.py"), *(p for folder in TOOLING for p in (REPO / folder).rglob("*.py"))]


def _imports() -> dict[str, set[str]]:
    """top-level module -> the files (relative to the repository) importing it, third-party only."""
    found: dict[str, set[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names}:
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(path.relative_to(REPO).as_posix())
    return found


def _distributions() -> dict[str, list[str]]:
    """top-level module -> the installed distributions that provide it. Python 3.10's
    ``packages_distributions`` skips distributions without a ``top_level.txt`` (open_clip_torch
    among them), so each distribution's file list fills the gaps."""
    found = {k: list(v) for k, v in metadata.packages_distributions().items()}
    for dist in metadata.distributions():
        if dist.read_text("top_level.txt") is not None:
            continue  # packages_distributions read it already
        name = dist.metadata["Name"]
        tops = {f.parts[0].removesuffix(".py") for f in dist.files or () if f.parts}
        for top in tops:
            if top.isidentifier() and name not in found.setdefault(top, []):
                found[top].append(name)
    return found


def test_every_imported_distribution_is_declared():
    core, extras = _declared()
    dists = _distributions()
    problems = []
    for module, files in sorted(_imports().items()):
        candidates = {_norm(d) for d in dists.get(module, [module])}  # not installed (vllm): its own name
        product = sorted(f for f in files if not f.startswith(TOOLING))
        allowed = core | extras.get("vllm", set()) if product else core | set().union(*extras.values())
        if not candidates & allowed:
            problems.append(f"{module} ({', '.join(sorted(candidates))}) imported by {sorted(files)[:3]}")
    assert not problems, "imported but not declared in pyproject.toml:\n" + "\n".join(problems)


def test_the_check_sees_the_imports_it_must():
    found = _imports()
    assert {"torch", "ray", "mlflow", "aiohttp", "safetensors", "PIL"} <= set(found)
    assert any(f.startswith("benchmarks/") for f in found.get("uvicorn", ()))  # a tool's own extra (bench)
    assert any(f.startswith("platform/hardpos/") for f in found["torch"])
