"""Every code block of the README and of ``docs/*.md`` runs, in order, one test per file.

A file's blocks run as a reader would try them, in one session: Python blocks
are exec'd in one namespace; a Python block whose first line is ``# NAME.py``
is saved as ``NAME.py`` in the session's working directory and imported
(``from NAME import *``), so that workers and later blocks can import it by
that name (one that names Django is only saved: Django's settings are once per
process, so the page's ``manage.py`` commands run it); ``pycon`` blocks run as
doctests in the same namespace; ``sh``,
``bash`` and ``console`` blocks (in ``console``, the ``$ `` lines) run with
bash in the working directory, where ``.venv`` is the venv running the tests;
``crontab`` entries are parsed with the command's own parser; ``yaml`` alert
rules may name only metrics that ``uniqjob.metrics`` serves; ``json`` is
parsed. ``text`` (output) and ``sql`` (shown beside the SQLite example that
runs it) are not run.

A block preceded by ``<!-- readme-test: skip (REASON) -->`` is left out; the
reason is required. Placeholders the examples use are pointed at the test
session's own resources: the Redis URLs below at the private redis-server,
``/var/lib/myapp`` at a directory of the test's own (so the examples run as
any user and leave nothing behind).
"""

from __future__ import annotations

import contextlib
import doctest
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import uniqjob
from tests.redis_server import RedisServer
from tests.support import nonroot
from uniqjob.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The documentation files whose blocks run: the README and every guide (drafts excluded).
DOC_FILES = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if not p.name.startswith("_draft_"))]

# Kept for the modules that read their own drafts' Python blocks with it.
_BLOCK = re.compile(r"(<!-- readme-test: skip[^>]*-->\s*)?^( *)```python\n(.*?)^\2```", re.S | re.M)
_FENCE = re.compile(
    r"(?:<!-- readme-test: skip(?P<reason>[^>]*)-->[ \t]*\n)?"
    r"^(?P<indent> *)```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^(?P=indent)```",
    re.S | re.M,
)
_MODULE = re.compile(r"# ([A-Za-z_]\w*)\.py\n")
_REDIS_URLS = ("redis://localhost:6379/0", "redis://redis.internal:6379/0", "redis://localhost:6379")
_PLACEHOLDER_DIR = "/var/lib/myapp"
#: Exit statuses that say a documented command line is wrong: usage errors, an internal
#: error, a command that could not be run or found.
_BAD_EXITS = {2, 64, 70, 126, 127}
_RUN = frozenset({"python", "pycon", "sh", "bash", "console", "crontab", "yaml", "json"})
_SHOWN = frozenset({"text", "sql"})


@dataclass(frozen=True)
class Block:
    """One fenced code block of a documentation file."""

    path: Path
    line: int
    lang: str
    body: str
    skip: str | None  # the reason given, when the block is marked to be skipped

    @property
    def where(self) -> str:
        name = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{name}:{self.line} ({self.lang})"


def blocks_of(path: Path) -> list[Block]:
    """Return every fenced block of ``path``, dedented, in order."""
    text = path.read_text()
    found = []
    for m in _FENCE.finditer(text):
        reason = m.group("reason")
        found.append(
            Block(
                path,
                text.count("\n", 0, m.start("body")),
                m.group("lang"),
                textwrap.dedent(m.group("body")),
                None if reason is None else reason.strip(),
            )
        )
    return found


def python_blocks() -> list[str]:
    """Return the README's runnable Python blocks, dedented, in order."""
    return [b.body for b in blocks_of(README) if b.lang == "python" and b.skip is None]


class Session:
    """What a reader has at hand while following one file: a directory, a venv, a Redis."""

    def __init__(self, work: Path, redis_url: str) -> None:
        self.work = work
        self.redis_url = redis_url
        self.namespace: dict[str, object] = {"__name__": "docs"}
        self.modules: list[str] = []
        self.outputs: list[tuple[Block, str]] = []
        self._venv(work / ".venv")
        self.env = {
            **os.environ,
            "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
            "XDG_STATE_HOME": str(work / "state"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        self.env.pop("UNIQJOB_URL", None)

    @staticmethod
    def _venv(where: Path) -> None:
        """Make ``where`` the reader's ``.venv``: the venv running the tests, or one standing in for it.

        Run by an interpreter outside a venv (the non-root test's), ``.venv/bin`` holds a
        ``python`` and a ``uniqjob`` that run this interpreter with its ``PYTHONPATH``.
        """
        if sys.prefix != sys.base_prefix and (Path(sys.prefix) / "bin" / "uniqjob").exists():
            where.symlink_to(sys.prefix)
            return
        (where / "bin").mkdir(parents=True)
        (where / "bin" / "python").symlink_to(sys.executable)
        shim = where / "bin" / "uniqjob"
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m uniqjob "$@"\n')
        shim.chmod(0o755)

    def source(self, block: Block) -> str:
        text = block.body
        for url in _REDIS_URLS:
            text = text.replace(url, self.redis_url)
        return text.replace(_PLACEHOLDER_DIR, str(self.work / "var-lib-myapp"))

    def run(self, block: Block) -> None:
        getattr(self, "_" + block.lang)(block, self.source(block))

    def _python(self, block: Block, source: str) -> None:
        module = _MODULE.match(source)
        if module:
            name = module.group(1)
            (self.work / f"{name}.py").write_text(source)
            if "django" in source:
                return  # run by the page's own commands (manage.py), each a process of its own
            self.modules.append(name)
            source = f"from {name} import *"
        try:
            exec(compile(source, block.where, "exec"), self.namespace)
        except Exception as exc:  # pragma: no cover - the message is the point
            pytest.fail(f"{block.where} failed: {exc!r}\n{source}")

    def _pycon(self, block: Block, source: str) -> None:
        test = doctest.DocTestParser().get_doctest(
            source, self.namespace, block.where, str(block.path), block.line
        )
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.IGNORE_EXCEPTION_DETAIL)
        report: list[str] = []
        runner.run(test, out=report.append, clear_globs=False)
        assert runner.failures == 0, "".join(report)

    def _sh(self, block: Block, source: str) -> None:
        errors = self.work / ".errors"
        errors.write_text("")
        script = f"trap 'echo \"$? $BASH_COMMAND\" >> {shlex.quote(str(errors))}' ERR\n{source}"
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = done.stdout + done.stderr
        failed = [line for line in errors.read_text().splitlines() if int(line.split()[0]) in _BAD_EXITS]
        assert not failed, f"{block.where}: {failed}\n{output}"
        assert "Traceback" not in output and "internal error" not in output, f"{block.where}:\n{output}"
        self.outputs.append((block, output))

    _bash = _sh

    def _console(self, block: Block, source: str) -> None:
        commands = "\n".join(line[2:] for line in source.splitlines() if line.startswith("$ "))
        assert commands, f"{block.where}: no $ lines"
        self._sh(block, commands)

    def _crontab(self, block: Block, source: str) -> None:
        parser = build_parser()
        entries = [line for line in source.splitlines() if line.strip() and not line.startswith("#")]
        for entry in entries:
            if re.match(r"[A-Z_]+=", entry):
                continue  # an environment line
            command = shlex.split(entry)[5:]
            assert command and command[0].startswith("/") and command[0].endswith("/bin/uniqjob"), (
                f"{block.where}: cron's PATH lacks a venv: give the full path of uniqjob in {entry!r}"
            )
            try:
                parser.parse_args(command[1:])
            except SystemExit:  # pragma: no cover - the message is the point
                pytest.fail(f"{block.where}: the command line is refused: {entry!r}")

    def _yaml(self, block: Block, source: str) -> None:
        from uniqjob.metrics import render

        served = set(re.findall(r"^# TYPE (\w+)", render(uniqjob.config.resolve("memory://")).decode(), re.M))
        named = set(re.findall(r"\buniqjob_\w+", source))
        assert named and named <= served, f"{block.where}: not served: {sorted(named - served)}"

    def _json(self, block: Block, source: str) -> None:
        try:
            json.loads(source)
        except ValueError as exc:
            pytest.fail(f"{block.where}: not JSON: {exc}")

    def close(self) -> None:
        for name in self.modules:
            sys.modules.pop(name, None)


def run_file(path: Path, work: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Session:
    """Run every block of ``path`` in order in a new session in ``work``; return it."""
    monkeypatch.chdir(work)
    monkeypatch.syspath_prepend(str(work))
    session = Session(work, redis_url)
    try:
        for block in blocks_of(path):
            if block.skip is None and block.lang not in _SHOWN:
                session.run(block)
    finally:
        session.close()
        uniqjob.configure(None)
    return session


def test_every_block_is_run_or_says_why_not() -> None:
    for path in DOC_FILES:
        for block in blocks_of(path):
            assert block.lang in _RUN | _SHOWN, f"{block.where}: a block needs a language this test knows"
            if block.skip is not None:
                assert re.fullmatch(r"\(.{10,}\)", block.skip), f"{block.where}: say why it is skipped"


def test_readme_has_examples() -> None:
    assert len(python_blocks()) >= 3


@pytest.mark.parametrize(  # the files whose examples take seconds run with -m slow
    "path",
    [
        pytest.param(p, marks=pytest.mark.slow) if p.name in {"README.md", "operations.md", "redis.md"} else p
        for p in DOC_FILES
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_examples_of_each_file_run(
    path: Path,
    tmp_path: Path,
    redis_server: RedisServer,
    redis_client: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (work := tmp_path / "work").mkdir()
    placeholder_there = Path(_PLACEHOLDER_DIR).exists()
    session = run_file(path, work, redis_server.url, monkeypatch)
    assert Path(_PLACEHOLDER_DIR).exists() == placeholder_there, "an example wrote outside its directory"
    if path == README:
        outputs = "\n".join(output for _, output in session.outputs)
        # the tour: the duplicate is dropped while the first still runs, and the log says so
        assert re.search(
            r"INFO uniqjob\.job: __main__\.Export dropped: __main__\.Export:1:\w+ is already locked",
            outputs,
        )
        assert "None\nexported 7\nexported 42\n" in outputs
        # the two terminals: the second run says who holds the lock and exits 75
        assert (
            re.search(r"lock 'uniqjob\.cli\.run:1:\w+' is held by pid \d+", outputs) and "exit 75" in outputs
        )
    if path.name == "django.md":
        outputs = "\n".join(output for _, output in session.outputs)
        # enqueued, the duplicate dropped, its lock listed, run by db_worker, enqueued again
        assert "READY\nNone\n" in outputs and re.search(r"queued .* reports\.send_report\(42", outputs)
        assert "state=SUCCESSFUL" in outputs and "gracefully.\nREADY" in outputs, outputs
        # a concurrency limit of 1: the second call parked, run by the worker after the first
        assert "['TaskResult', 'Parked']" in outputs, outputs
        assert outputs.count("path=exports.export_month state=SUCCESSFUL") == 2, outputs
    if path.name == "cli.md":
        outputs = "\n".join(output for _, output in session.outputs)
        # once per tick: the second run of the tick does not run its command, and says why
        assert "ran this tick\nexit 75: this tick already ran\n" in outputs
        assert "already run in this 86400s tick" in outputs


def test_the_readme_test_command_is_the_ci_one() -> None:
    ci = re.search(r'^TEST_CMD="(.*)"$', (ROOT / ".ci" / "run").read_text(), re.M)
    assert ci is not None
    assert f"&& {ci.group(1)}\n" in README.read_text()


@pytest.fixture(scope="session")
def unprivileged() -> Iterator[tuple[nonroot.Drop, nonroot.Environment]]:
    """A venv ``nobody`` may run, with this session's packages, and a copy of the repository."""
    try:
        drop = nonroot.find_drop("nobody")
        base = nonroot.system_python(drop)
    except nonroot.Unavailable as why:
        pytest.skip(f"cannot run the examples as a user who is not root: {why}")
    environment = nonroot.build(drop, base, ROOT)
    try:
        yield drop, environment
    finally:
        environment.close()


@pytest.mark.slow
def test_the_examples_run_as_a_user_who_is_not_root(
    unprivileged: tuple[nonroot.Drop, nonroot.Environment],
) -> None:
    drop, environment = unprivileged
    before = _owned_by(drop.uid)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(environment.home),
        "TMPDIR": str(environment.home),
        "PYTHONDONTWRITEBYTECODE": "1",
        **{k: v for k, v in os.environ.items() if k.startswith("UNIQJOB_REDIS")},
    }
    done = subprocess.run(
        [
            *drop.prefix,
            str(environment.python),
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            f"--rootdir={environment.tree}",
            "--all-tiers",  # every file's examples, those of the slow tier too
            "-k",
            "test_the_examples_of_each_file_run",
            "tests/test_readme.py",
        ],
        cwd=environment.tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert f"{len(DOC_FILES)} passed" in summary and "skipped" not in summary, done.stdout[-2000:]
    # they ran as that user, from the copy, on the copy's uniqjob
    who = "import os, uniqjob; print(os.geteuid(), uniqjob.__file__)"
    probe = subprocess.run(
        [*drop.prefix, str(environment.python), "-c", who],
        cwd=environment.home,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.split() == [str(drop.uid), str(environment.tree / "uniqjob" / "__init__.py")]
    # and wrote nothing of theirs in the shared temporary directories: only in their own
    assert _owned_by(drop.uid) <= before, sorted(_owned_by(drop.uid) - before)


def _owned_by(uid: int) -> set[Path]:
    """What ``uid`` owns at the top of the shared temporary directories."""
    owned = set()
    for shared in map(Path, dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"])):
        with contextlib.suppress(OSError):
            for entry in os.scandir(shared):
                with contextlib.suppress(OSError):  # gone since the listing
                    if entry.stat(follow_symlinks=False).st_uid == uid:
                        owned.add(Path(entry.path))
    return owned


def test_the_non_root_venv_gets_what_its_interpreters_markers_ask_for() -> None:
    # redis-py asks for async-timeout below Python 3.11.3: a system 3.11.2 needs it, 3.11.7 not
    installed = [
        ("redis", ['async-timeout>=4.0.3; python_full_version < "99"', 'hiredis>=3; extra == "hiredis"']),
        ("arq", ["redis[hiredis]<6,>=4.2.0", "click>=8.0"]),
        ("old", ['backport>=1; python_version < "3.0"']),
    ]
    assert nonroot.unmet(installed, {"redis", "arq", "click"}) == ["async-timeout>=4.0.3"]
    assert nonroot.unmet(installed, {"redis", "arq"}) == ["async-timeout>=4.0.3", "click>=8.0"]


def test_a_backport_pip_cannot_install_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"needs not a requirement!! .*pip could not install them"):
        nonroot.install_backports(Path(sys.executable), ["not a requirement!!"], tmp_path / "backports")


@pytest.mark.parametrize(
    "wrong",
    [
        "```python\nassert 1 == 2\n```\n",
        "```pycon\n>>> 1 + 1\n3\n```\n",
        "```sh\n.venv/bin/uniqjob run --no-such-option -- true\n```\n",
        "```sh\nno-such-command-anywhere\n```\n",
        "```crontab\n* * * * *  uniqjob run -- true\n```\n",
        "```crontab\n* * * * *  /srv/app/.venv/bin/uniqjob run --lease -- true\n```\n",
        "```yaml\nexpr: uniqjob_no_such_metric > 0\n```\n",
        "```json\n{not json}\n```\n",
    ],
    ids=["python", "pycon", "usage", "not-found", "cron-path", "cron-usage", "metric", "json"],
)
def test_a_wrong_example_fails_its_file(
    wrong: str, tmp_path: Path, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    (doc := tmp_path / "guide.md").write_text("# A guide\n\n" + wrong)
    (work := tmp_path / "work").mkdir()
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        run_file(doc, work, redis_server.url, monkeypatch)


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for the headings of ``path``."""
    anchors = set()
    for heading in re.findall(
        r"^#+ (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M), re.M
    ):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def test_every_link_between_the_files_reaches_its_file_and_heading() -> None:
    for path in DOC_FILES:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a link off this repository
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{path.name}: a link to {target}: no such file"
            if anchor:
                assert anchor in _anchors(linked), f"{path.name}: a link to {target}: no such heading"


@pytest.mark.slow
def test_the_first_set_up_command_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    (setup,) = [b for b in blocks_of(README) if b.lang == "sh" and "pip install ." in b.body]
    tree = tmp_path / "checkout"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "uniqjob"):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (ROOT / name).exists():
            shutil.copy(ROOT / name, tree / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "UNIQJOB_URL")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    done = subprocess.run(
        ["bash", "-c", setup.body],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 and re.search(
        r"No matching distribution|Could not find a version|Network", done.stderr
    ):
        pytest.skip(f"pip cannot reach a package index here: {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.endswith("hello\n"), done.stdout[-2000:]


def test_the_tour_runs_at_once(tmp_path: Path) -> None:
    """The tour's first step shows what it says: the other account runs at once, nothing times out."""
    tour = next(b for b in blocks_of(README) if b.lang == "python" and b.body.startswith("# tour.py\n"))
    (tmp_path / "tour.py").write_text(tour.body)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}  # the default file store, of its own
    started = time.monotonic()
    argv = [sys.executable, "tour.py"]
    done = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert done.stdout == "None\nexported 7\nexported 42\n"
    assert "__main__.Export dropped: __main__.Export:1:" in done.stderr
    assert took < 8, f"the tour took {took:.1f}s: a step waited out its 10 s timeout"
