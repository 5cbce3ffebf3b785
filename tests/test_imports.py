"""A fast start: what a fresh interpreter has loaded after ``import uniqjob`` and after ``uniqjob run``.

``import uniqjob`` loads no asyncio, no redis and no concurrency machinery until
they are used; ``uniqjob run`` on the file store loads none of the three, and on
a Redis URL no asyncio of its own (redis-py 8 imports asyncio itself, on
``import redis``: that much is redis-py's, not ours). Each case is a new
interpreter (``subprocess``): this session has long imported everything.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.redis_server import RedisServer

HEAVY = ("asyncio", "redis", "uniqjob.concurrency")

# Runs the code given, then prints the names in sys.modules as JSON on the last line of stdout.
_PROBE = """\
import json, sys
{code}
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded once it has run ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(code=code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(names)


def _after_run(url: str) -> set[str]:
    """The modules loaded once ``uniqjob run --url URL --key k -- true`` has run (as the console script)."""
    return _loaded(
        "from uniqjob.cli import main\n"
        f"status = main(['run', '--url', {url!r}, '--key', 'k', '--', 'true'])\n"
        "assert status == 0, status"
    )


def _heavy(modules: set[str]) -> list[str]:
    return [name for name in HEAVY if name in modules]


def test_import_uniqjob_loads_no_asyncio_redis_or_concurrency() -> None:
    assert _heavy(_loaded("import uniqjob")) == []


def test_the_public_names_still_load_on_first_use() -> None:
    loaded = _loaded("from uniqjob import UniqueJob, Parked, configure, JobLock\nassert UniqueJob and Parked")
    assert {"uniqjob.job", "uniqjob.concurrency", "uniqjob.config", "uniqjob.joblock"} <= loaded


def test_uniqjob_run_on_the_file_store_loads_none_of_them(tmp_path: Path) -> None:
    assert _heavy(_after_run((tmp_path / "locks").as_uri())) == []


def test_uniqjob_run_on_a_redis_url_loads_no_asyncio_of_its_own(
    redis_server: RedisServer, redis_client: object
) -> None:
    loaded = _after_run(redis_server.url)
    assert "redis" in loaded  # it did run on Redis
    assert "uniqjob.concurrency" not in loaded
    # redis-py 8 loads asyncio on `import redis` (redis.event, redis.background): not ours to avoid.
    if "asyncio" in loaded:
        assert "asyncio" in _loaded("import redis"), "uniqjob's own code imported asyncio on the sync path"


# What `uniqjob run` on the file store does not need, and once loaded: filelock (the
# stripes flock() on POSIX), the asyncio API's job lock and a store's async face, the
# Redis store's URL module, the stdlib modules only some key or client needs, and
# logging (loaded when a logger of ours is first used: a run that logs nothing).
NOT_ON_THE_FILE_STORE = (
    "logging",
    "filelock",
    "uniqjob._joblock_async",
    "uniqjob.stores.aio",
    "uniqjob.stores._async_base",
    "uniqjob.stores.redis",
    "uniqjob.stores.redis._url",
    "decimal",
    "uuid",
    "datetime",
    "socket",
    "shutil",
    "random",
)


def test_uniqjob_run_on_the_file_store_loads_only_what_it_uses(tmp_path: Path) -> None:
    loaded = _after_run((tmp_path / "locks").as_uri())
    assert [name for name in NOT_ON_THE_FILE_STORE if name in loaded] == []


def test_uniqjob_run_on_the_default_store_loads_only_what_it_uses(tmp_path: Path) -> None:
    """No --url and no UNIQJOB_URL: the per-user file store, as cron runs it."""
    code = (
        "import os\n"
        f"os.environ['XDG_STATE_HOME'] = {str(tmp_path)!r}\n"
        "os.environ.pop('UNIQJOB_URL', None)\n"
        "from uniqjob.cli import main\n"
        "status = main(['run', '--key', 'k', '--', 'true'])\n"
        "assert status == 0, status"
    )
    loaded = _loaded(code)
    assert "uniqjob.stores.file" in loaded  # it did run on the file store
    assert [name for name in (*HEAVY, *NOT_ON_THE_FILE_STORE) if name in loaded] == []


def test_a_library_warning_still_reaches_the_command_s_stderr_when_logging_loads_late() -> None:
    """The command's one-line handler is put in place when a logger of ours is first used."""
    code = (
        "import sys\n"
        "from uniqjob.cli import _library_warnings_to_stderr\n"
        "from uniqjob.stores._log import get_logger\n"
        "log = get_logger('uniqjob.heartbeat')\n"
        "with _library_warnings_to_stderr():\n"
        "    assert 'logging' not in sys.modules\n"
        "    log.warning('renewal of %s failed', 'k\\x1b')\n"
        "    log.info('not shown')\n"
        "import logging\n"
        "assert logging.getLogger('uniqjob').handlers == []  # taken away when the command ends"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "uniqjob: renewal of k\\x1b failed\n"


def test_each_subcommand_loads_only_its_own_module(tmp_path: Path) -> None:
    loaded = _after_run((tmp_path / "locks").as_uri())
    assert "uniqjob.cli._run" in loaded
    assert (
        not {"uniqjob.cli._dashboard", "uniqjob.cli._mcp", "uniqjob.cli._stats", "uniqjob.cli._locks"}
        & loaded
    )
