"""The examples of docs/_draft_functions.md (README "Plain functions" and the cron ``--once-per``) run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.test_readme import _BLOCK

DRAFT = Path(__file__).resolve().parent.parent / "docs" / "_draft_functions.md"
_SH = re.compile(r"^```sh\n(.*?)^```", re.S | re.M)


def test_the_python_examples_run() -> None:
    text = DRAFT.read_text()
    blocks = [textwrap.dedent(m.group(3)) for m in _BLOCK.finditer(text) if not m.group(1)]
    assert len(blocks) == 3
    namespace: dict[str, object] = {"__name__": "readme"}
    for n, block in enumerate(blocks, 1):
        try:
            exec(compile(block, f"{DRAFT.name} python block {n}", "exec"), namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{DRAFT.name} python block {n} failed: {exc!r}\n{block}")


def test_the_cron_example_runs_once_per_tick(tmp_path: Path) -> None:
    (block,) = _SH.findall(DRAFT.read_text())
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "UNIQJOB_URL": tmp_path.as_uri()}
    done = subprocess.run(
        ["bash", "-c", block], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout == "ran this tick\nexit 75: this tick already ran\n", done.stderr
    assert "already run in this 86400s tick" in done.stderr
