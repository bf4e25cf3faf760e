"""How heavy the house is: the numbers the package's layout is judged by, read from the source.

    python tests/support/house_stats.py [--root platform/hardpos] [--json]

Pure ``ast`` over the files (nothing is imported), so it measures any checkout, e.g. an old
commit exported with ``git archive``. It prints:

* modules and lines of the installed product (``platform/hardpos``) and of the repository's
  tooling beside it (measuring tools ``benchmarks/``, test helpers ``tests/support/``);
* cross-module private imports: ``from hardpos.x import _name`` (goal 0): a private name
  used by another module is a public surface that pretends not to be one;
* import cycles among module-level imports (goal 0), as strongly connected components, and
  the same counting imports inside functions too (a lazy import that closes a circle still
  ties two modules into one idea);
* re-export-only lines (goal 0): module-level imports of names the module never uses itself
  (listing a name in ``__all__`` is no use), one line per name, and module-level aliases
  ``a = b`` of an imported name, kept only so callers find ``b`` under another path;
* the largest functions (goal: none over ~80 lines without a reason).

The rules that keep the goals at 0 are tests in ``tests/project/test_layout.py``, which use the same
functions.
"""
from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "hardpos"
#: Folders of the repository (relative to its root, posix) that are tooling, not installed.
TOOLING = ("benchmarks", "tests/support")
LONG_FUNCTION = 80


def module_name(path: Path, root: Path) -> str:
    """``hardpos.a.b`` for ``root/a/b.py`` (``hardpos.a`` for ``root/a/__init__.py``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([root.name, *parts])


def package_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def tooling_files(root: Path) -> list[Path]:
    """The tooling's modules in the checkout whose package folder is ``root``
    (``<checkout>/platform/hardpos``)."""
    checkout = root.parent.parent
    return sorted(p for t in TOOLING if (checkout / t).is_dir() for p in package_files(checkout / t))


def absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` names, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: module level, also inside module-level
    ``if``/``try`` blocks, but not inside functions or ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.append(node)
            elif isinstance(node, ast.If):
                test = node.test
                if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
                        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
                    walk(node.orelse)
                    continue
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                for part in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                    walk(part)

    walk(tree.body)
    return out


def parse(root: Path) -> dict[str, tuple[Path, ast.Module]]:
    return {module_name(p, root): (p, ast.parse(p.read_text(encoding="utf-8"), filename=str(p)))
            for p in package_files(root)}


def private_imports(root: Path, mods: dict[str, tuple[Path, ast.Module]] | None = None) -> list[str]:
    """``file:line: from M import _x`` for every private name imported from another module of
    the package (``__future__`` and dunder names excepted)."""
    mods = mods or parse(root)
    out = []
    for name, (path, tree) in mods.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = absolute(name, node, path.name == "__init__.py")
            if not target.startswith(root.name):
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno}: from {target} import {alias.name}")
    return out


def import_graph(root: Path, mods: dict[str, tuple[Path, ast.Module]] | None = None,
                 lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules its import-time imports load (``from pkg import mod``
    counts as importing ``pkg.mod`` when that is a module; importing ``a.b.c`` also imports
    ``a`` and ``a.b``). ``lazy=True`` adds the imports inside functions: a cycle through them
    does not fail at import but still ties the two modules into one."""
    mods = mods or parse(root)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, (path, tree) in mods.items():
        graph[name]
        nodes = ([n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] if lazy
                 else top_level_imports(tree))
        for node in nodes:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = absolute(name, node, path.name == "__init__.py")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                if not t.startswith(root.name):
                    continue
                parts = t.split(".")
                for i in range(1, len(parts) + 1):
                    prefix = ".".join(parts[:i])
                    if prefix in mods and prefix != name and not name.startswith(prefix + "."):
                        graph[name].add(prefix)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _all_names(tree: ast.Module) -> set[int]:
    """ids of the nodes of the module's ``__all__ = [...]`` assignments (a name listed there
    is not thereby used)."""
    out: set[int] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            out |= {id(n) for n in ast.walk(node)}
    return out


def reexport_lines(root: Path, mods: dict[str, tuple[Path, ast.Module]] | None = None) -> list[str]:
    """Module-level imports of names the module never uses itself (``__init__.py`` files,
    whose job is a package's public surface, excepted), one line per such name, and
    ``alias = imported_name`` assignments. Listing a name in ``__all__`` is not a use: that
    is exactly how a module re-exports."""
    mods = mods or parse(root)
    out = []
    for name, (path, tree) in mods.items():
        if path.name == "__init__.py":
            continue
        listed = _all_names(tree)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in listed}
        used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
        # names a string annotation mentions count as used
        for n in ast.walk(tree):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.isidentifier() \
                    and id(n) not in listed:
                used.add(n.value)
        annotations = " ".join(ast.unparse(n.annotation) for n in ast.walk(tree)
                               if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation is not None)
        annotations += " ".join(ast.unparse(n.returns) for n in ast.walk(tree)
                                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns is not None)
        imported: set[str] = set()
        rel = path.relative_to(root.parent).as_posix()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                for alias in node.names:
                    local = alias.asname or alias.name
                    imported.add(local)
                    if local not in used and not re.search(rf"\b{re.escape(local)}\b", annotations):
                        out.append(f"{rel}:{node.lineno}: from {'.' * node.level}{node.module or ''} import {alias.name}"
                                   + (f" as {alias.asname}" if alias.asname else ""))
            elif isinstance(node, ast.Import):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Tuple)):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                if values and all(isinstance(v, ast.Name) and v.id in imported for v in values):
                    out.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return out


def functions(root: Path, mods: dict[str, tuple[Path, ast.Module]] | None = None) -> list[tuple[int, str]]:
    """(lines, ``file:line: name``) of every function and method, longest first."""
    mods = mods or parse(root)
    out = []
    for _, (path, tree) in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                out.append((n, f"{path.relative_to(root.parent).as_posix()}:{node.lineno}: {node.name}"))
    return sorted(out, reverse=True)


def stats(root: Path = PACKAGE) -> dict:
    mods = parse(root)
    product = package_files(root)
    tooling = tooling_files(root)
    lines = lambda ps: sum(len(p.read_text(encoding="utf-8").splitlines()) for p in ps)  # noqa: E731
    funcs = functions(root, mods)
    return {
        "product_modules": len(product), "product_lines": lines(product),
        "tooling_modules": len(tooling), "tooling_lines": lines(tooling),
        "private_imports": private_imports(root, mods),
        "cycles": cycles(import_graph(root, mods)),
        "cycles_with_lazy_imports": cycles(import_graph(root, mods, lazy=True)),
        "reexport_lines": reexport_lines(root, mods),
        "largest_functions": [f"{n} lines  {where}" for n, where in funcs[:5]],
        "functions_over_limit": sum(1 for n, _ in funcs if n > LONG_FUNCTION),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=PACKAGE, help="the package folder (default: platform/hardpos)")
    ap.add_argument("--json", action="store_true", help="print the full lists as JSON")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every offender")
    args = ap.parse_args(argv)
    s = stats(args.root.resolve())
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"product (installed):      {s['product_modules']} modules, {s['product_lines']} lines")
    print(f"tooling ({', '.join(t + '/' for t in TOOLING)}): {s['tooling_modules']} modules, {s['tooling_lines']} lines")
    print(f"cross-module private imports: {len(s['private_imports'])}")
    print(f"import cycles:            {len(s['cycles'])}" + "".join(f"\n  {' <-> '.join(c)}" for c in s["cycles"]))
    print(f"cycles through in-function imports too: {len(s['cycles_with_lazy_imports'])}"
          + "".join(f"\n  {' <-> '.join(c)}" for c in s["cycles_with_lazy_imports"]))
    print(f"re-export-only lines:     {len(s['reexport_lines'])}")
    print(f"functions over {LONG_FUNCTION} lines:   {s['functions_over_limit']}; largest:")
    for f in s["largest_functions"]:
        print(f"  {f}")
    if args.verbose:
        for key in ("private_imports", "reexport_lines"):
            print(f"\n{key}:")
            for line in s[key]:
                print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
