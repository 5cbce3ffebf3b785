"""uniqjob uses its dependencies through their public API only: read from the source with :mod:`ast`.

An attribute read or written as ``x._name`` is private to whoever defines
``_name``. uniqjob may use its own (a name some ``uniqjob/`` module defines: a
function, a class, a method, an attribute it assigns, a field it declares), and
nothing else: ``conn._sock``, ``retry._backoff``, ``node._free`` on redis-py's
or valkey-py's objects are what this test is for. Likewise an import of a
private module or name of another package (``from redis._parsers import
_RESP2Parser``), and a version check (``redis.__version__``): what a library
does is read by what it offers, not by its version number.

The few underscore names the standard library documents as public (a named
tuple's ``_make``, ``os._exit``, ...) are listed by name below.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "uniqjob"

#: Underscore names the standard library documents as public API.
STDLIB_PUBLIC = frozenset({
    "_make", "_replace", "_fields", "_asdict", "_field_defaults",  # collections.namedtuple
    "_exit",  # os._exit
    "_getframe",  # sys._getframe
    "_current_frames",  # sys._current_frames
})  # fmt: skip


#: Known uses outside the Redis store, each to be removed by the owner of its module (not this test's).
KNOWN: frozenset[tuple[str, str]] = frozenset({
})  # fmt: skip


@dataclass(frozen=True)
class Use:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _trees(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield str(path.relative_to(root.parent)), ast.parse(path.read_text(encoding="utf-8"), str(path))


def defined(trees: list[tuple[str, ast.Module]]) -> set[str]:
    """Every underscore name the package defines: what it may use as ``x._name``."""
    names: set[str] = set()

    def target(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):  # self._x = ..., cls._y = ...
            names.add(node.attr)
        elif isinstance(node, ast.Tuple | ast.List):
            for item in node.elts:
                target(item)
        elif isinstance(node, ast.Starred):
            target(node.value)

    for _, tree in trees:
        # getattr(x, "_name") reads a name: it defines none (setattr(x, "_name", v) does)
        read = {
            id(node.args[1])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _reflected(node) and ast.unparse(node.func) != "setattr"
        }
        for node in ast.walk(tree):
            if id(node) in read:
                continue
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for item in node.targets:
                    target(item)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor | ast.comprehension):
                target(node.target)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                target(node.optional_vars)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                names.add(node.value)  # __slots__ entries, namedtuple fields, setattr names
    return {name for name in names if _private(name)}


def _uniqjob_module(node: ast.ImportFrom) -> bool:
    return node.level > 0 or (node.module or "").split(".")[0] == "uniqjob"


def _reflected(node: ast.Call) -> str | None:
    """The underscore name ``getattr(x, "_name")`` (or setattr, hasattr, delattr) names; else None."""
    func, args = node.func, node.args
    reflect = ("getattr", "setattr", "hasattr", "delattr")
    if isinstance(func, ast.Name) and func.id in reflect and len(args) > 1:
        name = args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and _private(name.value):
            return name.value
    return None


def private_uses(root: Path = PACKAGE) -> list[Use]:
    """Each use in ``root`` of an underscore name its own code does not define, or of a version."""
    trees = list(_trees(root))
    own = defined(trees) | STDLIB_PUBLIC
    found: list[Use] = []
    for path, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if _private(node.attr) and node.attr not in own:
                    found.append(Use(path, node.lineno, f"{ast.unparse(node)} (not uniqjob's own)"))
                elif node.attr == "__version__":
                    found.append(Use(path, node.lineno, f"{ast.unparse(node)} (a version check)"))
            elif isinstance(node, ast.Call) and _reflected(node) not in (None, *own):
                found.append(Use(path, node.lineno, f"{ast.unparse(node)} (not uniqjob's own)"))
            elif isinstance(node, ast.ImportFrom) and not _uniqjob_module(node):
                parts = (node.module or "").split(".")
                for alias in node.names:
                    if any(_private(p) for p in parts) or _private(alias.name):
                        found.append(Use(path, node.lineno, f"from {node.module} import {alias.name}"))
                    elif alias.name == "__version__":
                        found.append(Use(path, node.lineno, f"from {node.module} import __version__"))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if any(_private(p) for p in alias.name.split(".")):
                        found.append(Use(path, node.lineno, f"import {alias.name}"))
    return found


def test_no_private_attribute_of_a_dependency_is_used() -> None:
    found = [use for use in private_uses() if (use.path, use.what.partition(" ")[0]) not in KNOWN]
    assert not found, "private API of another package used:\n" + "\n".join(map(str, found))


def test_what_the_kept_lanes_did_would_be_found(tmp_path: Path) -> None:
    # The deleted transport's uses, each of a kind the scan must catch, beside uniqjob's own.
    package = tmp_path / "uniqjob"
    package.mkdir()
    (package / "old.py").write_text(
        "import redis\n"
        "from redis._parsers import _RESP2Parser\n"
        "MAJOR = int(redis.__version__.split('.')[0])\n"
        "class Lane:\n"
        "    def __init__(self, conn):\n"
        "        self._conn = conn\n"
        "    def sock(self, retry, node, conn):\n"
        "        node._free.append(conn)\n"
        "        getattr(conn, '_sock').close()\n"
        "        return self._conn._sock, retry._backoff, retry._retries, retry._supported_errors\n",
        encoding="utf-8",
    )
    found = sorted(use.what for use in private_uses(package))
    assert found == sorted(
        [
            "from redis._parsers import _RESP2Parser",
            "redis.__version__ (a version check)",
            "node._free (not uniqjob's own)",
            "self._conn._sock (not uniqjob's own)",
            "retry._backoff (not uniqjob's own)",
            "retry._retries (not uniqjob's own)",
            "retry._supported_errors (not uniqjob's own)",
            "getattr(conn, '_sock') (not uniqjob's own)",
        ]
    )  # and self._conn, which Lane defines, is not among them


def test_uniqjob_s_own_private_names_are_allowed() -> None:
    trees = list(_trees(PACKAGE))
    own = defined(trees)
    assert {"_keys", "_wire", "_acks", "_claim_call"} <= own  # the Redis store's, used by its faces
    assert "_sock" not in own and "_backoff" not in own and "_free" not in own


#: Where uniqjob reads one of its own underscore names that redis-py or valkey-py also uses
#: privately, on something other than ``self`` or ``cls``: each checked by hand to be uniqjob's object.
SHARED_NAMES_ON_OUR_OBJECTS = frozenset({
    ("uniqjob/locks.py", "state._read"),  # a LockState
    ("uniqjob/stores/redis/_async.py", "sync._read"),  # the RedisBackend behind RedisAsync
})  # fmt: skip


def _library_private_names(package: str) -> set[str]:
    """Every underscore attribute and function name in an installed package's source."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return set()
    names: set[str] = set()
    for path in Path(spec.origin).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _private(node.name):
                names.add(node.name)
    return names


def test_a_name_shared_with_the_client_libraries_is_read_on_our_own_objects() -> None:
    """The scan above lets uniqjob's own names through wherever they are read; a few are also
    redis-py's private names (``_encoder``, ``_execute``, ``_read``...), so ``client._encoder``
    would pass it. Such a name read on anything but ``self``/``cls`` is listed, checked by hand."""
    trees = list(_trees(PACKAGE))
    shared = defined(trees) & (_library_private_names("redis") | _library_private_names("valkey"))
    assert shared, "the client libraries' private names were not read"
    seen = {
        (path, ast.unparse(node))
        for path, tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr in shared
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    }
    unchecked = sorted(seen - SHARED_NAMES_ON_OUR_OBJECTS)
    assert not unchecked, f"check that these are uniqjob's objects, then list them: {unchecked}"
