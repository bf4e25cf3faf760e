"""The code runs on the oldest supported Python (``requires-python >= 3.10``): no module
imports a standard-library name that first appeared in a later version. The suite usually
runs on a newer interpreter, where such an import works, so without this check the break
shows only on the oldest interpreter. Pure ``ast`` over the source."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("platform", "jobs", "serve", "tests", "benchmarks", "infra")

# Names added after 3.10 that are easy to reach for, by module: (name, the version it came in).
NEWER_THAN_FLOOR = {
    "typing": {"Self": "3.11", "LiteralString": "3.11", "Never": "3.11", "assert_never": "3.11",
               "assert_type": "3.11", "reveal_type": "3.11", "Required": "3.11",
               "NotRequired": "3.11", "TypeVarTuple": "3.11", "Unpack": "3.11",
               "dataclass_transform": "3.11", "override": "3.12", "TypeAliasType": "3.12",
               "ReadOnly": "3.13", "TypeIs": "3.13"},
    "enum": {"StrEnum": "3.11", "verify": "3.11", "member": "3.11", "nonmember": "3.11"},
    "datetime": {"UTC": "3.11"},
    "itertools": {"batched": "3.12"},
    "asyncio": {"TaskGroup": "3.11", "timeout": "3.11", "Runner": "3.11"},
    "contextlib": {"chdir": "3.11"},
}
NEWER_MODULES = {"tomllib": "3.11"}


def _is_guarded(tree: ast.AST, node: ast.AST) -> bool:
    """True when the import sits in a ``try`` that catches ImportError/ModuleNotFoundError
    (the usual ``try: import tomllib / except: import tomli`` fallback)."""
    for outer in ast.walk(tree):
        if isinstance(outer, ast.Try) and any(node is n for stmt in outer.body for n in ast.walk(stmt)):
            for handler in outer.handlers:
                names = [ast.unparse(handler.type)] if handler.type is not None else ["bare"]
                if any(k in n for n in names for k in ("ImportError", "ModuleNotFoundError", "bare")):
                    return True
    return False


def newer_imports(source: str) -> list[str]:
    """Each unguarded import in ``source`` of a name or module newer than the floor, as text."""
    tree = ast.parse(source)
    found = []
    for node in ast.walk(tree):
        hits = []
        if isinstance(node, ast.ImportFrom) and node.module in NEWER_THAN_FLOOR and node.level == 0:
            table = NEWER_THAN_FLOOR[node.module]
            hits = [f"from {node.module} import {a.name} ({table[a.name]})" for a in node.names if a.name in table]
        elif isinstance(node, ast.ImportFrom) and node.module in NEWER_MODULES:
            hits = [f"from {node.module} import ... ({NEWER_MODULES[node.module]})"]
        elif isinstance(node, ast.Import):
            hits = [f"import {a.name} ({NEWER_MODULES[a.name]})" for a in node.names if a.name in NEWER_MODULES]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            table = NEWER_THAN_FLOOR.get(node.value.id, {})
            if node.attr in table:
                hits = [f"{node.value.id}.{node.attr} ({table[node.attr]})"]
        if hits and not _is_guarded(tree, node):
            found += [f"line {node.lineno}: {h}" for h in hits]
    return found


def test_no_module_needs_a_python_newer_than_the_floor():
    offenders = {}
    for d in SOURCE_DIRS:
        for path in sorted((REPO / d).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            hits = newer_imports(path.read_text())
            if hits:
                offenders[str(path.relative_to(REPO))] = hits
    assert offenders == {}, f"stdlib names newer than Python 3.10: {offenders}"


def test_the_check_flags_a_newer_name_and_spares_a_guarded_fallback():
    assert newer_imports("from typing import Callable, Self\n") == ["line 1: from typing import Self (3.11)"]
    assert newer_imports("import enum\nx = enum.StrEnum\n") == ["line 2: enum.StrEnum (3.11)"]
    assert newer_imports("import tomllib\n") == ["line 1: import tomllib (3.11)"]
    guarded = "try:\n    import tomllib\nexcept ModuleNotFoundError:\n    import tomli as tomllib\n"
    assert newer_imports(guarded) == []
