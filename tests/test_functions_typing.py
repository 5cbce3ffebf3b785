"""``@unique`` keeps the function's types: checked by mypy (``assert_type`` here, and a snippet run)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import assert_type

import pytest
from mypy import api

from tests.functions_jobs import Reports, send_report
from uniqjob import JobLock
from uniqjob.functions import UniqueFunction


def test_calls_keep_their_types() -> None:
    result = send_report(42)
    assert_type(result, str | None)
    assert_type(send_report.lock_key(42, note="x"), str)
    assert_type(send_report.is_locked(account_id=42), bool)
    assert_type(send_report.lock(42), JobLock)
    assert_type(Reports("p").build(3), str | None)
    bound: Callable[[int], str | None] = Reports("p").build  # self is bound through an instance
    unbound: Callable[[Reports, int], str | None] = Reports.build
    assert isinstance(bound, UniqueFunction) and unbound is Reports.build
    assert result is not None and result.startswith("report 42")
    assert Reports("p").build(3) == "p3"


@pytest.mark.slow
def test_mypy_rejects_calls_that_do_not_fit_the_function(tmp_path: Path) -> None:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent(
            """
            from tests.functions_jobs import Reports, send_report

            send_report("42")
            send_report.lock_key(42, nope=1)
            Reports("p").build(3, 4)
            reveal_type(send_report(1))
            """
        )
    )
    out, _, status = api.run(["--strict", "--no-incremental", "--follow-imports=silent", str(snippet)])
    assert status == 1
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(str(snippet))]
    assert any('Argument 1 to "__call__" of "UniqueFunction" has incompatible type "str"' in x for x in lines)
    assert any('Unexpected keyword argument "nope"' in x for x in lines)
    assert any("Too many arguments" in x for x in lines)
    assert any('Revealed type is "str | None"' in x for x in lines)
