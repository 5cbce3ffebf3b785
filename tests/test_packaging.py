"""The package as a user meets it: its namespace, and ``python -m uniqjob`` from the checkout."""

from __future__ import annotations

import ast
import configparser
import os
import re
import shlex
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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
    # Inside the package directory, its modules come first on sys.path: none may be named after a
    # standard library module (tests/test_old_names.py), and nothing rewrites sys.path.
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
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "",
        f"no locks held in FileBackend('{tmp_path}')\n",
    )


def _requirements(dist: str) -> dict[str, Requirement]:
    """The requirements of the installed ``dist`` this interpreter selects, extras left out, by name."""
    selected: dict[str, Requirement] = {}
    for text in requires(dist) or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            selected[canonicalize_name(requirement.name)] = requirement
    return selected


def _extra(name: str) -> list[str]:
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    return [line for line in config["options.extras_require"][name].splitlines() if line.strip()]


def test_arq_beside_celery_is_installed_as_the_docs_say() -> None:
    pytest.importorskip("arq", reason="arq is not installed: pip install --no-deps 'arq>=0.28'")
    # The docs' two lines, and .ci/run installing arq exactly so.
    (block,) = re.findall(
        r"```sh\n(pip install 'uniqjob\[celery\]'\n.*?)```", (REPO / "docs/arq.md").read_text(), re.S
    )
    first, second = block.splitlines()
    assert first == "pip install 'uniqjob[celery]'" and second.startswith("pip install --no-deps ")
    assert set(_extra("celery")) <= set(_extra("test"))  # .ci/run's first line, '.[test]', has Celery
    ci = re.search(r'^ARQ_BESIDE_CELERY="(.*)"$', (REPO / ".ci/run").read_text(), re.M)
    assert ci is not None and f"pip install {ci.group(1)}" == second
    assert _extra("arq") == ["arq>=0.28"] and _extra("celery") == ["celery[redis]>=5.3"]

    # Why --no-deps: arq's redis pin and Celery's (kombu's) exclude each other here.
    arq = _requirements("arq")
    kombu = Requirement(
        next(r for r in requires("kombu") or [] if r.startswith("redis") and "redis" in r.split(";")[1])
    )
    redis_py = Version(version("redis"))
    assert redis_py in kombu.specifier and redis_py not in arq["redis"].specifier, (
        f"arq now accepts redis-py {redis_py} ({arq['redis']}): docs/arq.md and .ci/run can drop --no-deps"
    )
    # What the second line names is all of arq's own requirements but redis-py, and each is met.
    named = {canonicalize_name(Requirement(word.strip("'")).name) for word in shlex.split(second)[3:]}
    assert named == {"arq", *(set(arq) - {"redis"})}
    for name, requirement in arq.items():
        if name != "redis":
            assert Version(version(name)) in requirement.specifier, f"{requirement}: {version(name)}"
    # redis-py itself: the one uniqjob asks for (install_requires: redis>=5.0)
    assert redis_py in _requirements("uniqjob")["redis"].specifier


@pytest.mark.parametrize(
    ("module", "missing", "extra"),
    [
        ("uniqjob.integrations.rq", "rq", "rq"),
        ("uniqjob.integrations.celery", "celery", "celery"),
        ("uniqjob.integrations.arq", "arq", "arq"),
        ("uniqjob.integrations.apscheduler", "apscheduler", "apscheduler"),
        ("uniqjob.integrations.huey", "huey", "huey"),
        ("uniqjob.integrations.django", "django", "django"),
        ("uniqjob.integrations.django", "django_tasks", "django"),  # Django < 6 without the backport
        ("uniqjob.integrations.dramatiq", "dramatiq", "dramatiq"),
        ("uniqjob.dashboard", "jinja2", "dashboard"),
        ("uniqjob.dashboard", "starlette", "dashboard"),
    ],
)
def test_a_missing_extra_names_the_pip_command(module: str, missing: str, extra: str) -> None:
    """As ``uniqjob.metrics`` does: not a bare ``No module named 'rq'``."""
    code = f"""
import sys
sys.modules[{missing!r}] = None  # not installed: importing it fails as a missing module does
try:
    import {module}
except ModuleNotFoundError as exc:
    print(exc.name)
    print(exc)
else:
    print("imported")
"""
    argv = [sys.executable, "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    name, message = done.stdout.splitlines()[:2]
    assert name.partition(".")[0] == missing, done.stdout  # starlette.applications: starlette
    assert f"{module} needs " in message and f"pip install 'uniqjob[{extra}]'" in message, message


def _imports_arq(node: ast.AST) -> bool:
    """Whether ``node`` imports arq, or the test helpers that do (``tests.arq_jobs``)."""
    return any(
        (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "arq")
        or (isinstance(n, ast.ImportFrom) and n.module == "tests.arq_jobs")
        or (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "arq" for a in n.names))
        for n in ast.walk(node)
    )


def _skips_without_arq(node: ast.AST) -> bool:
    """Whether ``node`` holds a ``pytest.importorskip("arq", ...)``."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "importorskip"
        and n.args
        and isinstance(n.args[0], ast.Constant)
        and n.args[0].value == "arq"
        for n in ast.walk(node)
    )


def test_every_test_that_needs_arq_skips_without_it() -> None:
    """``.[test]`` leaves arq out (it pins a redis-py that Celery refuses): the README's test command
    on a fresh clone must skip, not fail, each test that imports it (module-wide or in the test)."""
    bare = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if any(_skips_without_arq(n) for n in tree.body if isinstance(n, ast.Expr)):
            continue  # the whole module skips
        bare += [
            f"{path.name}::{f.name}"
            for f in tree.body
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            and _imports_arq(f)
            and not _skips_without_arq(f)
        ]
    assert not bare, f"these import arq without pytest.importorskip('arq'): {bare}"
