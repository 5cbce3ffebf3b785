"""``uniqjob mcp``, driven by the MCP SDK's own client over stdio, against a real store.

The server runs as a user's agent starts it (``python -m uniqjob mcp --url ...``);
its two tools must answer what ``uniqjob locks --json`` and ``uniqjob locks
--concurrency --json`` print, and change nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.test_drops import Export
from tests.test_metrics import Scene, scene

__all__ = ["scene"]  # the fixture, shared with test_metrics

UNIQJOB = [sys.executable, "-m", "uniqjob"]


def cli(*args: str) -> list[dict[str, Any]]:
    done = subprocess.run([*UNIQJOB, *args], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def call(url: str, calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], list[dict[str, Any]]]:
    """Start the server, list its tools, make ``calls``; the tools listed and each call's object."""

    async def session() -> tuple[list[Any], list[dict[str, Any]]]:
        params = StdioServerParameters(command=sys.executable, args=[*UNIQJOB[1:], "mcp", "--url", url])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            tools = (await client.list_tools()).tools
            answers = []
            for name, arguments in calls:
                result = await client.call_tool(name, arguments)
                assert not result.is_error, result.content
                text = result.content[0].text  # type: ignore[union-attr]
                assert result.structured_content == json.loads(text)
                answers.append(json.loads(text))
            return tools, answers

    return anyio.run(session)


def _key_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without the figures that tick with the clock between two reads."""
    return [
        {k: v for k, v in row.items() if k not in ("age_s", "ttl_s", "lease_s", "oldest_wait_s", "due_s")}
        for row in rows
    ]


@pytest.mark.slow
def test_the_tools_answer_what_the_cli_prints_and_change_nothing(scene: Scene) -> None:
    url = scene.url
    tools, (locks, some, concurrency, one) = call(
        url,
        [
            ("locks", {}),
            ("locks", {"job_class": "Export", "limit": 1}),
            ("concurrency", {}),
            ("concurrency", {"top": 1}),
        ],
    )
    assert {t.name for t in tools} == {"locks", "concurrency"}
    assert all(t.annotations is not None and t.annotations.read_only_hint for t in tools)

    rows = cli("locks", "--url", url, "--json")
    (figures,) = cli("stats", "--url", url, "--json")
    assert figures["duplicates"] == {Export.job_name(): 2} and figures["window_s"] == 3600.0
    assert sorted(_key_rows(locks["locks"]), key=str) == sorted(_key_rows(rows), key=str)
    assert locks["duplicates"] == figures["duplicates"] and locks["more"] is False
    assert locks["coalesced"] == figures["coalesced"] == {"app.Latest": 2}
    assert locks["replaced"] == figures["replaced"] == {"app.Fresh": 1}
    assert len(some["locks"]) == 1 and some["more"] is True  # two Export locks, one asked for
    assert some["locks"][0]["class"] == Export.job_name()

    keys = cli("locks", "--concurrency", "--json", "--url", url)
    assert _key_rows(concurrency["keys"]) == _key_rows(keys)
    assert concurrency["left_out"] == 0
    assert _key_rows([concurrency["totals"]]) == _key_rows([figures["concurrency"]])
    assert len(one["keys"]) == 1 and one["left_out"] == 1
    assert one["keys"][0]["key"] == keys[0]["key"]  # the busiest

    assert cli("locks", "--url", url, "--json")[:-1] and scene.unchanged()


@pytest.mark.slow
def test_bad_arguments_are_a_tool_error_naming_them(scene: Scene) -> None:
    async def session() -> list[str]:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "uniqjob", "mcp", "--url", scene.url]
        )
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            out = []
            for name, arguments in (("locks", {"limit": 0}), ("concurrency", {"top": -1})):
                result = await client.call_tool(name, arguments)
                assert result.is_error
                out.append(result.content[0].text)  # type: ignore[union-attr]
            return out

    limit, top = anyio.run(session)
    assert "limit must be a whole number from 1 to 10000, got 0" in limit
    assert "top must be a whole number from 1 to 10000, got -1" in top
    assert scene.unchanged()


def test_without_the_sdk_the_command_says_what_to_install(tmp_path: Any) -> None:
    # A site directory whose mcp package cannot be imported, ahead of the real one.
    (tmp_path / "mcp").mkdir()
    (tmp_path / "mcp" / "__init__.py").write_text("raise ImportError('no mcp here')\n")
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*UNIQJOB, "mcp", "--url", (tmp_path / "locks").as_uri()],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 78
    assert "uniqjob mcp needs the mcp SDK: pip install 'uniqjob[mcp]'" in done.stderr


def test_an_unreachable_store_is_a_tool_error_saying_so(tmp_path: Any) -> None:
    async def session() -> str:
        url = "redis://127.0.0.1:1/0?timeout=2"  # nothing listens on port 1
        params = StdioServerParameters(command=sys.executable, args=[*UNIQJOB[1:], "mcp", "--url", url])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            result = await client.call_tool("locks", {})
            assert result.is_error
            return str(result.content[0].text)  # type: ignore[union-attr]

    text = anyio.run(session)
    assert "Error executing tool locks" in text and "127.0.0.1:1" in text
