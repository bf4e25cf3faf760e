"""The package's layout rules, checked on the source so a regression fails a test.

* (a) every import inside a function body carries a ``# lazy: <why>`` comment, except the
  genuinely heavy optional dependencies in :data:`HEAVY_OPTIONAL` (see :func:`lazy_imports`
  for exactly where the comment may stand); the same holds for the repository's tooling
  (:data:`TOOLING`);
* (b) nothing in the package reaches outside it: no ``sys.path`` in code, no string literal
  naming the ``tests/`` folder, and no ``../shared`` anywhere (code, docstrings, data files);
* (c) the installed package is the product: it imports none of the tooling that lives beside
  it in the repository (the measuring tools ``benchmarks``, the test helpers ``tests.support``),
  and no measuring tool or test helper lives inside it;
* (d) a module is one idea with a public surface: no module imports another's private
  (``_name``) names, no module exists only to re-export another's, and no two modules import
  each other at import time (:mod:`tests.support.house_stats` counts all three);
* (e) the package's top-level units (its subpackages and modules) import each other in no
  cycle, imports inside functions counted, and the data path is layered as :data:`FORBIDDEN`
  lists (data < rules < world, rules < audit; rules and world import no evaluation,
  generation, stage, training or serving code); each offending import is named with its file
  and line.

Each test lists every offender in its assertion message, so one run says what to fix.
Pure ``ast``/text reads: no HardPos module is imported.
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "platform" / "hardpos"
#: The repository's tooling: run from the repository, never installed (top-level modules).
TOOLING = {"benchmarks": REPO / "benchmarks", "tests": REPO / "tests" / "support"}
#: Modules (and their submodules) that may be imported inside a function without a
#: ``# lazy:`` comment: optional and heavy (seconds to import, often not installed).
HEAVY_OPTIONAL = ("vllm", "matplotlib", "ray.data.llm")
LAZY = re.compile(r"#\s*lazy:\s*\S")
TESTS_PATH = re.compile(r"(^|[/\\])tests([/\\]|$)")


def modules() -> list[Path]:
    found = sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(found) > 50, f"expected the HardPos package under {PACKAGE}, found {len(found)} modules"
    return found


def rel(path: Path) -> str:
    """``hardpos/...`` for the package's files, ``benchmarks/...`` / ``tests/...`` for the tooling's."""
    return path.relative_to(PACKAGE.parent if path.is_relative_to(PACKAGE.parent) else REPO).as_posix()


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted module names an import statement loads ("." prefixes for relative ones)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return ["." * node.level + (node.module or "")]


def _heavy(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HEAVY_OPTIONAL)


def _justified(lines: list[str], lineno: int) -> bool:
    """True when the import at 1-based ``lineno`` has a ``# lazy:`` comment on its own line or
    in the run of comment / import / blank lines directly above it (one comment may cover an
    import group, e.g. ``import matplotlib; matplotlib.use("Agg")`` is NOT part of the run, so
    a group split by a statement needs its own comment)."""
    i = lineno - 1
    if LAZY.search(lines[i]):
        return True
    i -= 1
    while i >= 0:
        text = lines[i].strip()
        if LAZY.search(text):
            return True
        if not (text.startswith("#") or text.startswith(("import ", "from ")) or text == ""):
            return False
        i -= 1
    return False


def lazy_imports(path: Path) -> list[str]:
    """Imports inside a function (def, async def, lambda; nested ones too) of ``path`` that
    are not of a :data:`HEAVY_OPTIONAL` module and have no ``# lazy:`` comment (see
    :func:`_justified`), as ``file:line: module``."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    seen: set[int] = set()
    out = []
    for func in ast.walk(ast.parse(source, filename=str(path))):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(func):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in seen:
                continue
            seen.add(id(node))
            names = _imported(node)
            if all(_heavy(n) for n in names) or _justified(lines, node.lineno):
                continue
            out.append(f"{rel(path)}:{node.lineno}: {', '.join(names)}")
    return out


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose, not code)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                ids.add(id(body[0].value))
    return ids


def outside_references(path: Path) -> list[str]:
    """``sys.path`` in code, a non-docstring string literal naming ``tests/``, or ``../shared``
    anywhere in the file (a module, a model config, any text file of the package)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    out = [f"{rel(path)}:{n}: ../shared" for n, line in enumerate(text.splitlines(), 1) if "../shared" in line]
    if path.suffix != ".py":
        return out
    tree = ast.parse(text, filename=str(path))
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                and node.value.id == "sys":
            out.append(f"{rel(path)}:{node.lineno}: sys.path")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            out.append(f"{rel(path)}:{node.lineno}: from sys import path")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                and TESTS_PATH.search(node.value):
            out.append(f"{rel(path)}:{node.lineno}: string naming tests/: {node.value[:60]!r}")
    return out


def tooling_imports(path: Path) -> list[str]:
    """Imports of the repository's tooling (:data:`TOOLING`) anywhere in ``path`` (module
    level or inside a function), as ``file:line: module``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [f"{rel(path)}:{node.lineno}: {name}" for name in _imported(node)
                    if name.split(".")[0] in TOOLING]
    return out


# --------------------------------------------------------------------------- the rules
def test_in_function_imports_say_why_they_are_lazy():
    tooling = sorted(p for folder in TOOLING.values() for p in folder.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(tooling) > 20, f"expected the measuring tools and test helpers in {list(TOOLING.values())}"
    bad = [line for p in modules() + tooling for line in lazy_imports(p)]
    assert not bad, ("imports inside functions without a '# lazy: <why>' comment (move them to the module top, "
                     f"or say why they must wait; exempt: {', '.join(HEAVY_OPTIONAL)}):\n" + "\n".join(bad))


def test_the_product_imports_no_tooling():
    bad = [line for p in modules() for line in tooling_imports(p)]
    assert not bad, ("the installed package imports the repository's tooling (benchmarks/, tests/support/), which "
                     "is not installed; a helper the product needs belongs in the product:\n" + "\n".join(bad))
    inside = [rel(p) for p in PACKAGE.iterdir() if p.name in ("perf", "testing", "benchmarks")]
    assert not inside, f"tooling inside the package: {inside} (measuring tools go in benchmarks/, test helpers in tests/support/)"


def test_the_package_does_not_reach_outside_itself():
    files = [p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.suffix in (".py", ".yaml", ".yml", ".json", ".txt", ".md", ".toml", ".cfg")]
    bad = [line for p in files for line in outside_references(p)]
    assert not bad, "the package must not touch sys.path, tests/ or ../shared:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- the checks themselves
@pytest.mark.parametrize("code, offenders", [
    ("def f():\n    import json\n", ["json"]),
    ("def f():\n    from hardpos import storage\n", ["hardpos"]),
    ("def f():\n    from . import x\n", ["."]),
    ("def f():\n    import json  # lazy: only here\n", []),
    ("def f():\n    # lazy: mlflow costs seconds\n    import mlflow\n    from mlflow import x\n", []),
    ("def f():\n    # lazy: why\n    import matplotlib\n    matplotlib.use('Agg')\n    import json\n", ["json"]),
    ("def f():\n    import matplotlib.pyplot as plt\n    import vllm\n    from ray.data.llm import b\n", []),
    ("def f():\n    import ray.data\n", ["ray.data"]),
    ("def f():\n    # lazy:\n    import json\n", ["json"]),  # a reason is required
    ("class A:\n    def m(self):\n        def g():\n            import os\n", ["os"]),
    ("import json\n\ndef f():\n    return json\n", []),
])
def test_lazy_import_rule(tmp_path, monkeypatch, code, offenders):
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    path = tmp_path / "m.py"
    path.write_text(code)
    assert [line.split(": ", 1)[1] for line in lazy_imports(path)] == offenders


@pytest.mark.parametrize("code, hits", [
    ("import sys\nsys.path.insert(0, 'x')\n", 1),
    ("from sys import path\n", 1),
    ("p = ROOT / 'tests' / 'openai_stub.py'\n", 1),
    ("p = 'tests/openai_stub.py'\n", 1),
    ("DATA = '../shared/data'\n", 1),
    ('"""Docstring: tests/test_x.py checks this; MLflow puts it on sys.path."""\nx = "latest"\n', 0),
    ("# see ../shared/data\n", 1),
])
def test_outside_reference_rule(tmp_path, monkeypatch, code, hits):
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    path = tmp_path / "m.py"
    path.write_text(code)
    assert len(outside_references(path)) == hits, outside_references(path)


@pytest.mark.parametrize("code, offenders", [
    ("from benchmarks.harness import compare_alternating\n", ["benchmarks.harness"]),
    ("def f():\n    import benchmarks  # lazy: no\n", ["benchmarks"]),
    ("from tests.support import free_port\n", ["tests.support"]),
    ("from hardpos.eval import benchmarks\nimport testsuite\n", []),
])
def test_tooling_import_rule(tmp_path, monkeypatch, code, offenders):
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    path = tmp_path / "m.py"
    path.write_text(code)
    assert [line.split(": ", 1)[1] for line in tooling_imports(path)] == offenders


def test_modules_are_ideas_with_public_surfaces():
    """(d): no private name crosses a module boundary, nothing is imported only to be
    re-exported, and the import graph has no cycle, counting the imports inside functions
    too: a cycle through a lazy import does not fail at import time but still ties the two
    modules into one (the numbers ``python tests/support/house_stats.py`` prints, held at zero)."""
    from tests.support import house_stats  # lazy: the measuring module is only this test's

    mods = house_stats.parse(PACKAGE)
    assert house_stats.private_imports(PACKAGE, mods) == []
    assert house_stats.reexport_lines(PACKAGE, mods) == []
    assert house_stats.cycles(house_stats.import_graph(PACKAGE, mods)) == []
    assert house_stats.cycles(house_stats.import_graph(PACKAGE, mods, lazy=True)) == []


def test_every_stage_module_owns_its_check_and_run():
    """A stage is one module (plus its name in the CLI's list): ``Config``, ``check(cfg)`` that the
    runtime calls before any work, and ``run(cfg, ctx)``; no central table of checks elsewhere.
    Its module is ``hardpos/stages/<name>.py`` or, where driver and workers live together, the
    ``stage`` module of its own package (``runtime.STAGE_MODULES``); ``stages/compose.py`` holds
    the steps the demo and the base stage share and is no stage."""
    from hardpos import runtime

    missing = []
    for name in runtime.STAGES:
        module = runtime.STAGE_MODULES.get(name, f"hardpos.stages.{name}")
        path = PACKAGE.parent / (module.replace(".", "/") + ".py")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.ImportFrom) for t in
                    [ast.Name(a.asname or a.name) for a in n.names]}
        missing += [f"{module}: {want}" for want in ("Config", "check", "run") if want not in defined]
    assert missing == []
    in_stages = sorted(p.stem for p in (PACKAGE / "stages").glob("*.py") if p.stem not in ("__init__", "compose"))
    assert in_stages == sorted(n for n in runtime.STAGES if n not in runtime.STAGE_MODULES), \
        "runtime.STAGES and the stage modules under hardpos/stages differ"


@pytest.mark.parametrize("code, offenders", [
    ("from a import x, y\n\nz = x\n", ["from a import y", "z = x"]),
    ("from a import x\n\n__all__ = ['x']\n", ["from a import x"]),  # listing it is not using it
    ("from a import x\n\n__all__ = ['f']\n\ndef f(v: 'x'):\n    return v\n", []),  # a string annotation is a use
    ("from a import x as y\n\ndef f():\n    return y.z\n", []),
    ("import json\n", []),  # plain imports may load a module for its side effects
])
def test_reexport_rule(tmp_path, code, offenders):
    from tests.support import house_stats  # lazy: the measuring module is only these tests'

    (tmp_path / "m.py").write_text(code)
    assert [line.split(": ", 1)[1] for line in house_stats.reexport_lines(tmp_path)] == offenders


# --------------------------------------------------------------------------- (e) layering
#: What each unit must not import, anywhere (inside functions too): the data path runs
#: data < rules < world and rules < audit, and none of them reaches up into what uses them.
FORBIDDEN = {
    "data": ("rules", "world", "audit"),
    "rules": ("world", "audit", "eval", "generate", "stages", "train", "serve", "tracking"),
    "world": ("audit", "eval", "generate", "stages", "train", "serve"),
}


def _unit(module: str, package: str) -> str | None:
    """The top-level unit (subpackage or module) of ``package`` that ``module`` lies in:
    ``hardpos.rules.lexicon`` -> ``rules``; None for the package itself or another package."""
    parts = module.split(".")
    return parts[1] if parts[0] == package and len(parts) > 1 else None


def unit_imports(root: Path) -> list[tuple[str, str, str]]:
    """(importing unit, imported unit, ``file:line``) for every import statement, at module
    level or inside a function, by which one top-level unit of the package at ``root`` loads
    another (``from hardpos import storage`` loads ``storage``; relative imports resolved)."""
    from tests.support import house_stats  # lazy: the measuring module is only these tests'

    mods = house_stats.parse(root)
    out = []
    for name, (path, tree) in mods.items():
        src = _unit(name, root.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = house_stats.absolute(name, node, path.name == "__init__.py")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for target in targets:
                dst = _unit(target, root.name)
                if src is not None and dst is not None and dst != src:
                    out.append((src, dst, f"{path.relative_to(root.parent).as_posix()}:{node.lineno}"))
    return list(dict.fromkeys(out))  # one line per import statement, not per name it imports


def unit_cycles(root: Path) -> list[str]:
    """Each import cycle among the package's top-level units, as its units and then every
    import that closes it (``file:line: hardpos.a imports hardpos.b``)."""
    from tests.support import house_stats  # lazy: the measuring module is only these tests'

    edges = unit_imports(root)
    graph: dict[str, set[str]] = {}
    for src, dst, _ in edges:
        graph.setdefault(src, set()).add(dst)
    out = []
    for cycle in house_stats.cycles(graph):
        out.append("cycle: " + " <-> ".join(f"{root.name}.{u}" for u in cycle))
        out += [f"  {where}: {root.name}.{src} imports {root.name}.{dst}" for src, dst, where in edges
                if src in cycle and dst in cycle]
    return out


def layer_violations(root: Path) -> list[str]:
    """Every import that breaks :data:`FORBIDDEN`, as ``file:line: hardpos.a imports hardpos.b``."""
    return [f"{where}: {root.name}.{src} imports {root.name}.{dst}" for src, dst, where in unit_imports(root)
            if dst in FORBIDDEN.get(src, ())]


def test_the_top_level_units_import_each_other_in_no_cycle():
    """No two of the package's subpackages and top-level modules reach each other, even
    through an import inside a function: each is below or above the other, never both."""
    bad = unit_cycles(PACKAGE)
    assert not bad, "import cycles between the package's top-level units:\n" + "\n".join(bad)


def test_the_data_path_is_layered():
    """data < rules < world and rules < audit: a rule never knows the world, an audit, a stage
    or a model; the world knows no audit, evaluation, stage or model; caption I/O knows none
    of rules, world or audit (:data:`FORBIDDEN`)."""
    bad = layer_violations(PACKAGE)
    assert not bad, "imports against the layers (see FORBIDDEN in tests/project/test_layout.py):\n" + "\n".join(bad)


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "hardpos"
    for rel_path, code in {"__init__.py": "", **files}.items():
        path = pkg / rel_path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return pkg


@pytest.mark.parametrize("files, cycles, violations", [
    ({"rules/__init__.py": "", "rules/a.py": "def f():\n    from hardpos.world import b  # lazy: x\n",
      "world/__init__.py": "", "world/b.py": "from hardpos.rules import a\n"},
     ["cycle: hardpos.rules <-> hardpos.world", "  hardpos/rules/a.py:2: hardpos.rules imports hardpos.world",
      "  hardpos/world/b.py:1: hardpos.world imports hardpos.rules"],
     ["hardpos/rules/a.py:2: hardpos.rules imports hardpos.world"]),
    ({"data/__init__.py": "from ..audit import blind\n", "audit/__init__.py": "", "audit/blind.py": "import json\n"},
     [], ["hardpos/data/__init__.py:1: hardpos.data imports hardpos.audit"]),
    ({"storage.py": "import hardpos.config\n", "config.py": "from hardpos import storage\n"},
     ["cycle: hardpos.config <-> hardpos.storage", "  hardpos/config.py:1: hardpos.config imports hardpos.storage",
      "  hardpos/storage.py:1: hardpos.storage imports hardpos.config"], []),
    ({"world/__init__.py": "from hardpos.rules import lexicon\n", "rules/__init__.py": "",
      "rules/lexicon.py": "from hardpos.data import captions\n", "data/__init__.py": "", "data/captions.py": ""},
     [], []),
])
def test_the_layering_checks_flag_made_up_offenders(tmp_path, files, cycles, violations):
    root = _package(tmp_path, files)
    assert unit_cycles(root) == cycles
    assert layer_violations(root) == violations
