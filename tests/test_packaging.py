"""The package as a user meets it: its namespace, and ``python -m uniqjob`` from the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import uniqjob

REPO = Path(__file__).resolve().parent.parent


def test_dir_shows_the_public_api_and_dunder_names_only() -> None:
    dunders = {name for name in vars(uniqjob) if name.startswith("__") and name.endswith("__")}
    assert dir(uniqjob) == sorted({*uniqjob.__all__, *dunders})
    for helper in ("Any", "TYPE_CHECKING", "annotations"):
        assert helper not in vars(uniqjob)
    for name in uniqjob.__all__:  # each one is there, the lazy ones on first use
        assert getattr(uniqjob, name) is not None


@pytest.mark.parametrize("where", [".", "uniqjob"])
def test_python_m_uniqjob_runs_from_the_checkout(where: str, tmp_path: Path) -> None:
    # Inside the package directory, its inspect.py and queue.py come first on sys.path.
    env = {**os.environ, "UNIQJOB_URL": f"file://{tmp_path}"}
    done = subprocess.run(
        [sys.executable, "-m", "uniqjob", "run", "--", sys.executable, "-c", "print('ran')"],
        cwd=REPO / where,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "ran\n", "")


def test_python_runs_the_package_directory_as_the_command(tmp_path: Path) -> None:
    env = {**os.environ, "UNIQJOB_URL": f"file://{tmp_path}"}
    done = subprocess.run(
        [sys.executable, "uniqjob", "locks"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "no locks held\n")
