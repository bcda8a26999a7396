"""The house's floors, read from the code's own imports: no import circles, and no arrow that runs back up.

Every ``.py`` under common, kernels, db, tuner and service belongs to one room
of :data:`ROOMS`; a module may import from its own room and from rooms on lower
floors, nothing else (two rooms on one floor do not import each other). Every
import counts: at module level, inside functions (the lazy ones), and under
``TYPE_CHECKING``. And no set of modules imports each other in a loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "kernels", "db", "tuner", "service")

ROOMS: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    # (room, floor, its modules: "pkg.*" is pkg and everything under it, a bare name that module alone)
    ("common", 1, ("common.*",)),
    ("kernels", 2, ("kernels.*",)),
    ("db", 2, ("db.*",)),
    ("tuner.matrix", 3, ("tuner.matrix.*",)),
    ("tuner.measure", 4, ("tuner.measure.*",)),
    ("tuner.select", 5, ("tuner.select.*",)),
    ("tuner.search", 6, ("tuner.search.*",)),
    ("tuner.execute", 7, ("tuner.execute.*",)),
    ("tuner.benchmark", 8, ("tuner.benchmark.*",)),
    ("service", 9, ("service.*",)),
    ("tuner (its face and the CLI)", 10, ("tuner", "tuner.__main__", "tuner.cli")),
)
"""Lowest floor first."""


def modules() -> dict[str, Path]:
    """Every module of the walked packages by its dotted name (a package by its own name, for its __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def room_of(module: str) -> tuple[str, int] | None:
    for room, floor, members in ROOMS:
        for m in members:
            if module == m.removesuffix(".*") or (m.endswith(".*") and module.startswith(m[:-1])):
                return room, floor
    return None


def imported(module: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module of the project, line) for every import in ``path``, wherever it stands in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the module pkg.mod; `from pkg import name` the package pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # `import a.b.c` of a module: the deepest one that exists
                name = name.rpartition(".")[0]
            if name and name != module:
                yield name, node.lineno


def graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the first line that does}."""
    known = modules()
    out: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        edges = out.setdefault(module, {})
        for target, line in imported(module, path, known):
            edges.setdefault(target, line)
    return out


def circles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(edges[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_every_module_has_a_room() -> None:
    homeless = [m for m in modules() if room_of(m) is None]
    assert not homeless, f"modules in no room of tests/test_layout.py's ROOMS (give each a floor): {homeless}"


def test_no_import_runs_back_up() -> None:
    edges, known = graph(), modules()
    wrong = []
    for module, targets in sorted(edges.items()):
        here = room_of(module)
        for target, line in sorted(targets.items()):
            there = room_of(target)
            if here is None or there is None or here[0] == there[0]:
                continue  # a module without a room fails the test above
            if there[1] >= here[1]:
                wrong.append(f"{known[module].relative_to(REPO)}:{line}: {module} ({here[0]}, floor {here[1]}) "
                             f"imports {target} ({there[0]}, floor {there[1]})")
    assert not wrong, "imports from the same floor or a higher one:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    edges = graph()
    found = circles(edges)
    described = [" <-> ".join(c) + ": " + ", ".join(f"{a} -> {b}" for a in c for b in c if b in edges[a])
                 for c in found]
    assert not found, "import circles:\n" + "\n".join(described)


def test_the_walk_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The walk itself: an import inside a function, under TYPE_CHECKING and a relative one all count."""
    (tmp_path / "pkg").mkdir()
    code = ("from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n    import pkg.c\n"
            "def f():\n    from pkg.d import name\n")
    (tmp_path / "pkg" / "a.py").write_text(code)
    known = {f"pkg.{m}": tmp_path / "pkg" / f"{m}.py" for m in "abcd"} | {"pkg": tmp_path / "pkg" / "__init__.py"}
    assert sorted(t for t, _ in imported("pkg.a", known["pkg.a"], known)) == ["pkg.b", "pkg.c", "pkg.d"]
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
