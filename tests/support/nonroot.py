"""A Python an unprivileged user may run, with this test session's packages: for the non-root doc run.

The venv running the tests may be out of that user's reach twice over: its
interpreter can live under ``/root`` (pyenv), and the checkout itself under a
``0700`` directory (CI clones anywhere). :func:`build` makes, in a new
directory every user may enter, a venv of a system interpreter of the same
``X.Y`` (same ABI, so the installed wheels work unchanged), whose
site-packages reaches this venv's: through a ``.pth`` line when that user can
read them, else through a hard-linked (or, across file systems, copied) tree.
The repository's files the tests need are copied beside it. A backport that
the other interpreter's patch level needs and this one did not (redis-py asks
for ``async-timeout`` below Python 3.11.3) is installed there with pip.

:func:`find_drop` and :func:`system_python` say, in :class:`Unavailable`, why
a machine cannot do it (not root, no ``runuser``/``setpriv``, no such user, no
system Python of this version).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: The repository entries the doc tests read, relative to its root.
TREE = ("uniqjob", "tests", "docs", "benchmarks", ".ci", "README.md", "setup.cfg", "pyproject.toml")
#: Files of an editable install of uniqjob: they point at the checkout, which the user may not reach.
_EDITABLE = ("__editable__", "__editable___")


class Unavailable(Exception):
    """This machine cannot run a test as an unprivileged user; the message says why."""


@dataclass(frozen=True)
class Drop:
    """How to run a command as an unprivileged user."""

    user: str
    uid: int
    gid: int
    prefix: tuple[str, ...]

    def can_enter(self, path: Path) -> bool:
        """Whether the user may list and enter the directory ``path``."""
        done = subprocess.run([*self.prefix, "test", "-r", str(path), "-a", "-x", str(path)], check=False)
        return done.returncode == 0


@dataclass(frozen=True)
class Environment:
    """A venv the user of ``drop`` can run, and a copy of the repository it tests."""

    root: Path  # everything lives under it; removed by close()
    python: Path  # the venv's interpreter
    tree: Path  # the copy of the repository
    home: Path  # the user's HOME and TMPDIR, theirs alone
    linked: str  # how the venv reaches the packages: "pth", "hardlink" or "copy"
    installed: tuple[str, ...]  # backports installed for this interpreter's patch level

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def find_drop(user: str = "nobody") -> Drop:
    """How to run commands as ``user``; :class:`Unavailable` when this process cannot."""
    if os.geteuid() != 0:
        raise Unavailable(f"runs as root only (to become {user!r}); this is uid {os.geteuid()}")
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise Unavailable(f"no user {user!r} on this machine") from None
    if shutil.which("runuser"):
        prefix: tuple[str, ...] = ("runuser", "-u", user, "--")
    elif shutil.which("setpriv"):
        prefix = ("setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups", "--")
    else:
        raise Unavailable("neither runuser nor setpriv is on PATH (util-linux)")
    return Drop(user, entry.pw_uid, entry.pw_gid, prefix)


def system_python(drop: Drop) -> Path:
    """An interpreter of this one's ``X.Y`` that ``drop``'s user may run: this venv's base first."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = getattr(sys, "_base_executable", sys.executable)
    candidates = [base, f"/usr/bin/{version}", f"/usr/local/bin/{version}", shutil.which(version)]
    tried = []
    for candidate in dict.fromkeys(c for c in candidates if c):
        probe = subprocess.run(
            [*drop.prefix, candidate, "-c", "import sys; print(sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(sys.version_info[:2]):
            return Path(candidate)
        tried.append(candidate)
    raise Unavailable(f"no {version} that {drop.user!r} may run (tried {', '.join(tried)})")


def _reachable_dir(drop: Drop) -> Path:
    """A new directory, mode 0755, that ``drop``'s user may enter."""
    for parent in dict.fromkeys([tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]):
        if not Path(parent).is_dir():
            continue
        made = Path(tempfile.mkdtemp(prefix="uniqjob-nonroot-", dir=parent))
        made.chmod(0o755)
        if drop.can_enter(made):
            return made
        shutil.rmtree(made)
    raise Unavailable(f"no temporary directory that {drop.user!r} may enter")


def _link_tree(source: Path, target: Path) -> str:
    """Hard-link ``source``'s files into ``target`` (copy them if they are on another file system)."""
    try:
        shutil.copytree(source, target, symlinks=True, copy_function=os.link, ignore=_skip_editable)
        return "hardlink"
    except (OSError, shutil.Error):
        shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target, symlinks=True, ignore=_skip_editable)
    return "copy"


def _skip_editable(_directory: str, names: list[str]) -> set[str]:
    return {name for name in names if name.startswith(_EDITABLE) or name == "__pycache__"}


def _site_packages(python: Path) -> Path:
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(done.stdout.strip())


def unmet(installed: Iterable[tuple[str, list[str]]], present: set[str]) -> list[str]:
    """The requirements of ``installed`` (name, requirement strings) whose distribution is absent.

    Only requirements this interpreter's markers select count, extras left out:
    a version that does not match is not this function's business (``arq`` is
    installed ``--no-deps`` beside a newer redis-py on purpose).
    """
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    missing: dict[str, str] = {}
    for _name, requirements in installed:
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            name = canonicalize_name(requirement.name)
            if name not in present:
                missing.setdefault(name, text.split(";")[0].strip())
    return sorted(missing.values())


def _unmet_for(python: Path, tree: Path) -> list[str]:
    """What ``python`` lacks of what its installed distributions require (run in that interpreter)."""
    done = subprocess.run(
        [str(python), "-m", "tests.support.nonroot", "--unmet"],
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def install_backports(base: Path, needed: list[str], target: Path) -> None:
    """Install ``needed`` into ``target`` for ``base``; a RuntimeError naming them if pip cannot."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), *needed],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{base} needs {', '.join(needed)} (its patch level's markers ask for them, this"
            f" interpreter's did not) and pip could not install them: {done.stderr.strip()[-500:]}"
        )


def build(drop: Drop, base: Path, source: Path) -> Environment:
    """Make the venv and the copy of ``source`` (the repository); the caller closes it."""
    root = _reachable_dir(drop)
    try:
        tree = root / "tree"
        tree.mkdir()
        for name in TREE:
            if (source / name).is_dir():
                shutil.copytree(source / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
            elif (source / name).exists():
                shutil.copy2(source / name, tree / name)
        venv = root / "venv"
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        python = venv / "bin" / "python"
        site = _site_packages(python)
        ours = Path(sysconfig.get_paths()["purelib"])
        if drop.can_enter(ours):
            (site / "uniqjob-test-venv.pth").write_text(f"{ours}\n")
            linked = "pth"
        else:
            linked = _link_tree(ours, root / "site-packages")
            (site / "uniqjob-test-venv.pth").write_text(f"{root / 'site-packages'}\n")
        # The reader's `.venv/bin/uniqjob` (tests/test_readme.py links .venv to this venv).
        script = venv / "bin" / "uniqjob"
        script.write_text(f"#!{python}\nimport sys\nfrom uniqjob.cli import main\nsys.exit(main())\n")
        script.chmod(0o755)
        (site / "uniqjob-tree.pth").write_text(f"{tree}\n")
        needed = sorted(set(_unmet_for(python, tree)) - set(_unmet_for(Path(sys.executable), source)))
        if needed:
            install_backports(base, needed, root / "backports")
            (site / "uniqjob-backports.pth").write_text(f"{root / 'backports'}\n")
        home = root / "home"
        home.mkdir(mode=0o700)
        os.chown(home, drop.uid, drop.gid)
        return Environment(root, python, tree, home, linked, tuple(needed))
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def _main() -> None:
    from importlib.metadata import distributions

    from packaging.utils import canonicalize_name

    dists = list(distributions())
    present = {str(canonicalize_name(d.metadata["Name"])) for d in dists}
    print("\n".join(unmet(((d.metadata["Name"], d.requires or []) for d in dists), present)))


if __name__ == "__main__" and sys.argv[1:] == ["--unmet"]:
    _main()
