"""The README's Python examples run, in order, as one session (as a reader would paste them).

A block preceded by ``<!-- readme-test: skip -->`` is left out (it needs something
the test cannot give, say a running queue worker). Redis URLs in the examples are
pointed at the test session's private server.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from tests.redis_server import RedisServer

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"(<!-- readme-test: skip[^>]*-->\s*)?^( *)```python\n(.*?)^\2```", re.S | re.M)


def python_blocks() -> list[str]:
    """Return the README's runnable Python blocks, dedented, in order."""
    return [textwrap.dedent(m.group(3)) for m in _BLOCK.finditer(README.read_text()) if not m.group(1)]


def test_readme_has_examples() -> None:
    assert len(python_blocks()) >= 5


def test_readme_examples_run(redis_server: RedisServer, redis_client: object) -> None:
    namespace: dict[str, object] = {"__name__": "readme"}
    for n, block in enumerate(python_blocks(), 1):
        source = block.replace("redis://localhost:6379/0", redis_server.url)
        try:
            exec(compile(source, f"README.md python block {n}", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"README python block {n} failed: {exc!r}\n{source}")
