"""The package's layers, read from its source: the store layer imports nothing above it, and no two
parts import each other.

A *part* is a subpackage of ``uniqjob`` (``stores``, with ``stores.redis`` in it; ``concurrency``;
``cli``; ...) or one top-level module (``job``, ``joblock``, ``locks``, ...). Every ``import`` and
``from ... import`` in ``uniqjob/**/*.py`` is read with :mod:`ast`, those inside functions too
(an import put off until a call is still a dependency); those under ``if TYPE_CHECKING:`` are
kept apart, as they run for the type checker only.

- The store layer (``uniqjob/stores/``) may import only itself and the leaves, ``errors``,
  ``keys``, ``locks``, ``heartbeat`` and ``_moved`` (the deprecation warnings): everything
  else is above it (the job layer, ``job``, ``joblock``, ``queue``, ``settings`` and the
  concurrency glue; ``config``, the operations, the CLI and the integrations on top), and
  not even a type-checking import may name it.
- No cycle between parts through imports that run (``python tests/test_layers.py`` prints them).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "uniqjob"
STORES = "stores"
LEAVES = frozenset({"errors", "keys", "locks", "heartbeat", "_moved"})


@dataclass(frozen=True)
class Import:
    source: str  # dotted module name of the importer
    target: str  # dotted module name imported
    line: int
    typing_only: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _exists(module: str) -> bool:
    base = PACKAGE.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports_of(path: Path) -> Iterator[Import]:
    source = _module_name(path)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

    def visit(node: ast.AST, typing_only: bool) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:
                yield from visit(child, typing_only)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "uniqjob":
                    yield Import(source, alias.name, node.lineno, typing_only)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = source.split(".") if is_package else source.split(".")[:-1]
                base_parts = here[: len(here) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "uniqjob":
                for alias in node.names:
                    # ``from . import config`` imports the module uniqjob.config, not a name of uniqjob.
                    sub = f"{base}.{alias.name}"
                    yield Import(source, sub if _exists(sub) else base, node.lineno, typing_only)
        for inner in ast.iter_child_nodes(node):
            yield from visit(inner, typing_only)

    yield from visit(tree, False)


def imports() -> list[Import]:
    """Every import of a uniqjob module by a uniqjob module."""
    return [found for path in sorted(PACKAGE.rglob("*.py")) for found in _imports_of(path)]


def part(module: str) -> str:
    """The part a module belongs to: ``stores``, ``concurrency``, ``job``, ...; ``uniqjob`` for the facade."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "uniqjob"


def store_layer_violations(found: list[Import]) -> list[Import]:
    """Imports from the store layer of anything but itself and the leaves, type-checking ones too."""
    return [i for i in found if part(i.source) == STORES and part(i.target) not in LEAVES | {STORES}]


def cycles(found: list[Import]) -> list[list[str]]:
    """The groups of parts (two or more) that reach one another through imports that run."""
    graph: dict[str, set[str]] = {}
    for i in found:
        a, b = part(i.source), part(i.target)
        if not i.typing_only and a != b and "uniqjob" not in (a, b):  # the facade imports all
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return groups


def _show(found: list[Import], group: list[str]) -> list[str]:
    members = set(group)
    return [
        f"  {i.source} -> {i.target} (line {i.line})"
        for i in found
        if not i.typing_only
        and part(i.source) in members
        and part(i.target) in members
        and part(i.source) != part(i.target)
    ]


def test_the_reader_sees_imports() -> None:
    found = imports()
    pairs = {(i.source, i.target) for i in found}
    assert ("uniqjob.job", "uniqjob.joblock") in pairs
    assert ("uniqjob.stores.redis._store", "uniqjob.stores.base") in pairs
    assert ("uniqjob.stores.base", "uniqjob.locks") in pairs
    assert any(i.typing_only for i in found)


def test_the_store_layer_imports_nothing_above_it() -> None:
    bad = store_layer_violations(imports())
    assert not bad, "\n".join(f"{i.source} imports {i.target} (line {i.line})" for i in bad)


def test_no_cycle_between_parts() -> None:
    found = imports()
    groups = cycles(found)
    assert not groups, "\n".join(f"{' <-> '.join(g)}:\n" + "\n".join(_show(found, g)) for g in groups)


def test_a_cycle_would_be_found() -> None:
    found = [
        Import("uniqjob.stores.base", "uniqjob.job", 1, False),
        Import("uniqjob.job", "uniqjob.stores.base", 1, False),
        Import("uniqjob.job", "uniqjob.locks", 1, True),
        Import("uniqjob.locks", "uniqjob.job", 1, True),
    ]
    assert cycles(found) == [["job", "stores"]]
    assert store_layer_violations(found) == found[:1]


if __name__ == "__main__":
    found = imports()
    for i in store_layer_violations(found):
        print(f"store layer imports above it: {i.source} -> {i.target} (line {i.line})")
    for group in cycles(found):
        print(f"cycle: {' <-> '.join(group)}")
        print("\n".join(_show(found, group)))
    sys.exit(1 if store_layer_violations(found) or cycles(found) else 0)
