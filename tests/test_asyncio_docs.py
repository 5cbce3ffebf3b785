"""The arq example of docs/arq.md runs on a real arq worker, as written (asyncio.md's: test_readme.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration_workers import Workers, wait_until
from tests.redis_server import RedisServer
from tests.test_readme import _BLOCK

pytest.importorskip("arq", reason="arq is not installed: pip install --no-deps 'arq>=0.28'")

DRAFT = Path(__file__).resolve().parent.parent / "docs" / "arq.md"


def _blocks() -> list[tuple[bool, str]]:
    return [(bool(m.group(1)), textwrap.dedent(m.group(3))) for m in _BLOCK.finditer(DRAFT.read_text())]


@pytest.mark.slow
def test_the_arq_example_runs_on_a_real_worker(
    redis_server: RedisServer, redis_client: object, tmp_path: Path
) -> None:
    app, enqueue = [text for skipped, text in _blocks() if skipped]
    (tmp_path / "app.py").write_text(app)
    (tmp_path / "enqueue.py").write_text(enqueue)
    env = {"REDIS_URL": redis_server.url, "PYTHONPATH": str(tmp_path)}
    workers = Workers(tmp_path, env)
    try:
        workers.start("arq", [str(Path(sys.executable).with_name("arq")), "app.WorkerSettings"])
        wait_until(lambda: "Starting worker" in workers.log("arq"), "the arq worker to start")
        done = subprocess.run(
            [sys.executable, "enqueue.py"],
            cwd=tmp_path,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stdout == "True None\nreport 42\n", done.stderr
    finally:
        workers.close()
