"""The package's layers, read from its source: the store layer imports nothing above it, and no
import cycle, between parts or between modules.

A *part* is a subpackage of ``uniqjob`` (``stores``, with ``stores.redis`` in it; ``concurrency``;
``cli``; ...) or one top-level module (``job``, ``joblock``, ``locks``, ...). Every ``import`` and
``from ... import`` in ``uniqjob/**/*.py`` is read with :mod:`ast`, those inside functions too
(an import put off until a call is still a dependency); those under ``if TYPE_CHECKING:`` are
kept apart, as they run for the type checker only. ``from . import x`` names the module ``x``
when there is one; importing ``a.b.c`` counts as importing ``a.b.c`` only, not the packages
``a`` and ``a.b`` that Python runs first.

- The store layer (``uniqjob/stores/``) may import only itself and the leaves, ``errors``,
  ``keys``, ``locks`` and ``heartbeat``: everything else is above it (the job layer, ``job``,
  ``joblock``, ``queues``, ``settings`` and the concurrency glue; ``config``, the operations,
  the CLI and the integrations on top), and not even a type-checking import may name it.
- No cycle between parts through imports that run.
- No cycle between modules: none at all through the imports a module runs when it is imported
  (those at module level), and none through those put off into a function either, but for
  :data:`PENDING_CYCLES`.
- No module over :data:`MAX_LINES` lines (a generated ``*_sync.py`` twin too): more is a sign
  that it holds two ideas; an exception is named in :data:`LONG_MODULES` with why.

``python tests/test_layers.py`` prints what it finds.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "uniqjob"
STORES = "stores"
LEAVES = frozenset({"errors", "keys", "locks", "heartbeat"})

#: The module cycles still allowed, each closed by an import inside a function: none since the
#: Redis store's rewrite (issue 21 §1) removed the last two.
PENDING_CYCLES: frozenset[frozenset[str]] = frozenset()

#: The most lines a module may have.
MAX_LINES = 500
#: The modules allowed over MAX_LINES (dotted name -> why): none.
LONG_MODULES: dict[str, str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # dotted module name of the importer
    target: str  # dotted module name imported
    line: int
    typing_only: bool
    local: bool = False  # inside a function: it runs at the call, not when the module is imported


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _exists(module: str, package: Path) -> bool:
    base = package.parent.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _imports_of(path: Path, package: Path = PACKAGE) -> Iterator[Import]:
    source = _module_name(path, package)
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top = package.name

    def visit(node: ast.AST, typing_only: bool, local: bool) -> Iterator[Import]:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True, local)
            for child in node.orelse:
                yield from visit(child, typing_only, local)
            return
        local = local or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == top:
                    yield Import(source, alias.name, node.lineno, typing_only, local)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = source.split(".") if is_package else source.split(".")[:-1]
                base_parts = here[: len(here) - node.level + 1]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == top:
                for alias in node.names:
                    # ``from . import config`` imports the module uniqjob.config, not a name of uniqjob.
                    sub = f"{base}.{alias.name}"
                    target = sub if _exists(sub, package) else base
                    yield Import(source, target, node.lineno, typing_only, local)
        for inner in ast.iter_child_nodes(node):
            yield from visit(inner, typing_only, local)

    yield from visit(tree, False, False)


def imports(package: Path = PACKAGE) -> list[Import]:
    """Every import of a module of ``package`` by a module of ``package``."""
    return [found for path in sorted(package.rglob("*.py")) for found in _imports_of(path, package)]


def part(module: str) -> str:
    """The part a module belongs to: ``stores``, ``concurrency``, ``job``, ...; ``uniqjob`` for the facade."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "uniqjob"


def store_layer_violations(found: list[Import]) -> list[Import]:
    """Imports from the store layer of anything but itself and the leaves, type-checking ones too."""
    return [i for i in found if part(i.source) == STORES and part(i.target) not in LEAVES | {STORES}]


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more nodes (Tarjan's), each sorted."""
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


def _graph(
    found: list[Import], node: Callable[[str], str], counted: Callable[[Import], bool]
) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for i in found:
        a, b = node(i.source), node(i.target)
        if counted(i) and a != b:
            graph.setdefault(a, set()).add(b)
            graph.setdefault(b, set())
    return graph


def cycles(found: list[Import]) -> list[list[str]]:
    """The groups of parts (two or more) that reach one another through imports that run."""
    return _components(
        _graph(found, part, lambda i: not i.typing_only and "uniqjob" not in (part(i.source), part(i.target)))
    )  # the facade imports all


def module_cycles(found: list[Import], *, local: bool) -> list[list[str]]:
    """The groups of modules (two or more) that reach one another through imports that run.

    Only module-level imports, those that run when the module is imported; with ``local``, those
    inside functions too.
    """
    return _components(_graph(found, lambda m: m, lambda i: not i.typing_only and (local or not i.local)))


def _show(found: list[Import], group: list[str], node: Callable[[str], str] = part) -> list[str]:
    members = set(group)
    return [
        f"  {i.source} -> {i.target} (line {i.line}{', in a function' if i.local else ''})"
        for i in found
        if not i.typing_only
        and node(i.source) in members
        and node(i.target) in members
        and node(i.source) != node(i.target)
    ]


def _shown(found: list[Import], groups: list[list[str]], node: Callable[[str], str] = part) -> str:
    return "\n".join(f"{' <-> '.join(g)}:\n" + "\n".join(_show(found, g, node)) for g in groups)


def long_modules(package: Path = PACKAGE, most: int = MAX_LINES) -> dict[str, int]:
    """The modules of ``package`` over ``most`` lines, by dotted name: how many lines each has."""
    counts = {
        _module_name(path, package): len(path.read_bytes().splitlines()) for path in package.rglob("*.py")
    }
    return {name: count for name, count in sorted(counts.items()) if count > most}


def test_no_module_is_over_max_lines_but_the_named_ones() -> None:
    found = long_modules()
    over = {name: count for name, count in found.items() if name not in LONG_MODULES}
    assert not over, f"over {MAX_LINES} lines: {over}; split each, or name it in LONG_MODULES with why"
    stale = sorted(set(LONG_MODULES) - set(found))
    assert not stale, f"no longer over {MAX_LINES} lines: remove from LONG_MODULES: {stale}"


def test_a_long_module_would_be_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "sub" / "long_sync.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(package) == {"pkg.sub.long_sync": MAX_LINES + 1}


def test_the_reader_sees_imports() -> None:
    found = imports()
    pairs = {(i.source, i.target) for i in found}
    assert ("uniqjob.job", "uniqjob.joblock") in pairs
    assert ("uniqjob.stores.redis._store", "uniqjob.stores.base") in pairs
    assert ("uniqjob.stores.base", "uniqjob.locks") in pairs
    assert any(i.typing_only for i in found)
    assert any(i.local for i in found) and not all(i.local for i in found)


def test_the_store_layer_imports_nothing_above_it() -> None:
    bad = store_layer_violations(imports())
    assert not bad, "\n".join(f"{i.source} imports {i.target} (line {i.line})" for i in bad)


def test_no_cycle_between_parts() -> None:
    found = imports()
    groups = cycles(found)
    assert not groups, _shown(found, groups)


def test_no_cycle_between_modules_at_import() -> None:
    found = imports()
    groups = module_cycles(found, local=False)
    assert not groups, _shown(found, groups, str)


def test_no_cycle_between_modules_but_the_pending_ones() -> None:
    found = imports()
    groups = module_cycles(found, local=True)
    new = [g for g in groups if frozenset(g) not in PENDING_CYCLES]
    assert not new, _shown(found, new, str)
    gone = PENDING_CYCLES - {frozenset(g) for g in groups}
    assert not gone, "no longer a cycle: remove from PENDING_CYCLES:\n" + "\n".join(
        " <-> ".join(sorted(g)) for g in gone
    )


def test_a_cycle_would_be_found() -> None:
    found = [
        Import("uniqjob.stores.base", "uniqjob.job", 1, False),
        Import("uniqjob.job", "uniqjob.stores.base", 1, False),
        Import("uniqjob.job", "uniqjob.locks", 1, True),
        Import("uniqjob.locks", "uniqjob.job", 1, True),
    ]
    assert cycles(found) == [["job", "stores"]]
    assert store_layer_violations(found) == found[:1]
    assert module_cycles(found, local=False) == [["uniqjob.job", "uniqjob.stores.base"]]


def test_a_module_cycle_is_found_as_python_runs_the_imports(tmp_path: Path) -> None:
    """Within a subpackage too; ``from . import x`` is a submodule; TYPE_CHECKING imports do not count."""
    package = tmp_path / "pkg"
    files = {
        "__init__.py": "from . import a\n",
        "a.py": "from .sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "from . import c\n",
        "sub/c.py": "from typing import TYPE_CHECKING\nfrom .. import a\n"
        "if TYPE_CHECKING:\n    from . import d\n",
        "sub/d.py": "from .c import X\n\ndef later() -> None:\n    from pkg.sub import e\n",
        "sub/e.py": "import pkg.sub.d\n",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    found = imports(package)
    assert {(i.source, i.target, i.typing_only, i.local) for i in found} == {
        ("pkg", "pkg.a", False, False),
        ("pkg.a", "pkg.sub.b", False, False),
        ("pkg.sub.b", "pkg.sub.c", False, False),
        ("pkg.sub.c", "pkg.a", False, False),
        ("pkg.sub.c", "pkg.sub.d", True, False),
        ("pkg.sub.d", "pkg.sub.c", False, False),
        ("pkg.sub.d", "pkg.sub.e", False, True),
        ("pkg.sub.e", "pkg.sub.d", False, False),
    }
    assert module_cycles(found, local=False) == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    assert sorted(module_cycles(found, local=True)) == [
        ["pkg.a", "pkg.sub.b", "pkg.sub.c"],
        ["pkg.sub.d", "pkg.sub.e"],
    ]


if __name__ == "__main__":
    found = imports()
    for i in store_layer_violations(found):
        print(f"store layer imports above it: {i.source} -> {i.target} (line {i.line})")
    for name, count in long_modules().items():
        print(f"over {MAX_LINES} lines: {name} ({count}){' (named)' if name in LONG_MODULES else ''}")
    for group in cycles(found):
        print(f"cycle of parts: {' <-> '.join(group)}")
        print("\n".join(_show(found, group)))
    bad = bool(store_layer_violations(found) or cycles(found) or module_cycles(found, local=False))
    for group in module_cycles(found, local=True):
        pending = frozenset(group) in PENDING_CYCLES
        bad = bad or not pending
        print(f"cycle of modules{' (pending)' if pending else ''}: {' <-> '.join(group)}")
        print("\n".join(_show(found, group, str)))
    sys.exit(1 if bad else 0)
