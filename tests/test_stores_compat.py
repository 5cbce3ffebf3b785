"""``uniqjob.backends.*``: the old homes of the stores, importable for one release, warning once."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_OLD_NAMES = {
    "uniqjob.backends": ("uniqjob.stores", ["Backend"]),
    "uniqjob.backends.base": ("uniqjob.stores.base", ["Backend", "QueueMode"]),
    "uniqjob.backends.memory": ("uniqjob.stores.memory", ["MemoryBackend"]),
    "uniqjob.backends.file": ("uniqjob.stores.file", ["FileBackend"]),
    "uniqjob.backends.redis": ("uniqjob.stores.redis", ["RedisBackend"]),
}


def _run(script: str) -> object:
    """Run ``script`` in a fresh interpreter (nothing imported yet); return what it printed as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(done.stdout)


def test_old_modules_import_warn_once_each_and_hold_the_same_objects() -> None:
    found = _run(
        f"""
        import json, sys, warnings
        old_names = {_OLD_NAMES!r}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            same = {{}}
            for _ in range(2):  # a second import is a cached module: no second warning
                for old, (new, names) in old_names.items():
                    __import__(old), __import__(new)  # a plain import statement's call
                    was, now = sys.modules[old], sys.modules[new]
                    same[old] = all(getattr(was, n) is getattr(now, n) for n in names)
                    same[old] = same[old] and sorted(was.__all__) == sorted(names)
        print(json.dumps({{
            "same": same,
            "warnings": [[w.category.__name__, str(w.message), w.filename] for w in caught],
        }}))
        """
    )
    assert isinstance(found, dict)
    assert found["same"] == dict.fromkeys(_OLD_NAMES, True)
    messages = [message for _, message, _ in found["warnings"]]
    assert [category for category, _, _ in found["warnings"]] == ["DeprecationWarning"] * len(_OLD_NAMES)
    for old, (new, _) in _OLD_NAMES.items():
        [message] = [m for m in messages if m.startswith(f"{old} is deprecated")]
        assert message.endswith(f"import from {new}")
    # Each points at the line that imported the old module, not at the library.
    assert {filename for _, _, filename in found["warnings"]} == {"<string>"}


@pytest.mark.slow
def test_the_library_never_imports_the_old_modules() -> None:
    found = _run(
        """
        import importlib, json, pathlib, sys, warnings
        warnings.simplefilter("error", DeprecationWarning)
        import uniqjob
        top = pathlib.Path(uniqjob.__file__).parent
        skipped = []
        for path in sorted(top.rglob("*.py")):
            parts = path.relative_to(top.parent).with_suffix("").parts
            if parts[1] in ("__main__", "backends", "inspect"):
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            try:
                importlib.import_module(name)
            except ImportError as exc:  # an integration whose framework is not installed
                skipped.append(f"{name}: {exc}")
        old = sorted(m for m in sys.modules if m.startswith(("uniqjob.backends", "uniqjob.inspect")))
        print(json.dumps({"old": old, "skipped": skipped}))
        """
    )
    assert found == {"old": [], "skipped": []}
