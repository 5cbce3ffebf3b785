"""Parked calls stored as typed JSON: every supported value comes back equal and of the same type."""

from __future__ import annotations

import datetime as dt
import json
import math
import pickle
import uuid
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.concurrency_jobs import Color, Limited
from uniqjob import UniqueJob
from uniqjob.concurrency.codec import class_path, decode_call, decode_value, encode_call, encode_value
from uniqjob.errors import ConcurrencyLimitExceeded, UnstorableCallError

VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -(10**30),
    1.5,
    -0.0,
    math.inf,
    -math.inf,
    "",
    "héllo\x00",
    b"\x00\xff",
    bytearray(b"ab"),
    [1, [2, "3"]],
    (1, (2,)),
    (),
    {"a": 1, "b": [1]},
    {1: "int key", (1, 2): "tuple key", None: "none key"},
    {"$": "looks like a tag", "v": 1},
    {1, 2},
    frozenset({"x"}),
    dt.datetime(2024, 5, 1, 12, 30, 15, 123456),
    dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
    dt.datetime(2024, 3, 31, 2, 30, tzinfo=ZoneInfo("Europe/Paris")),
    dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    dt.date(2024, 2, 29),
    dt.time(23, 59, 59, 1),
    dt.time(8, 0, tzinfo=dt.timezone(dt.timedelta(hours=2))),
    dt.timedelta(days=-1, seconds=5, microseconds=7),
    Decimal("1.50"),
    Decimal("-0"),
    uuid.UUID("12345678-1234-5678-1234-567812345678"),
    Color.RED,
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_values_round_trip_with_their_types(value: Any) -> None:
    text = json.dumps(encode_value(value), allow_nan=False)
    back = decode_value(json.loads(text))
    assert back == value
    assert type(back) is type(value)
    if isinstance(value, (list, tuple)):
        assert [type(x) for x in back] == [type(x) for x in value]
    if isinstance(value, dt.datetime):
        assert back.tzinfo == value.tzinfo or back.utcoffset() == value.utcoffset()
        assert str(back) == str(value)
    if isinstance(value, Decimal):
        assert str(back) == str(value)  # 1.50 stays 1.50


def test_nan_round_trips() -> None:
    assert math.isnan(decode_value(json.loads(json.dumps(encode_value(math.nan)))))


class Opaque:
    pass


class Text(str):
    pass


class Fixed(dt.tzinfo):
    """A home-made zone: it could not be rebuilt from its name in another process."""

    def utcoffset(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(0)

    def dst(self, when: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(0)

    def tzname(self, when: dt.datetime | None) -> str:
        return "fixed"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (Opaque(), "args[0]"),
        ([1, Opaque()], "args[0][1]"),
        ({"conn": Opaque()}, "args[0]['conn']"),
        (Text("x"), "args[0]"),  # a str subclass would come back a plain str: not reversible
        (dt.datetime(2024, 1, 1, tzinfo=Fixed()), "args[0]"),
    ],
)
def test_unstorable_values_name_their_path(value: Any, path: str) -> None:
    with pytest.raises(UnstorableCallError) as info:
        encode_call(Limited, (value,), {}, "lock-key")
    assert info.value.path == path
    assert path in str(info.value)


def test_unstorable_keyword_argument_names_it() -> None:
    with pytest.raises(
        UnstorableCallError, match=r"kwargs\['conn'\]: values of type .*Opaque cannot be stored"
    ):
        encode_call(Limited, (), {"conn": Opaque()}, "k")


def test_a_call_round_trips() -> None:
    text = encode_call(Limited, (1, (2, 3)), {"when": dt.date(2024, 1, 1)}, "lock-key#2")
    call = decode_call(text)
    assert call.job_class is Limited
    assert call.args == (1, (2, 3))
    assert call.kwargs == {"when": dt.date(2024, 1, 1)}
    assert call.lock_key == "lock-key#2"
    assert "pickle" not in text and json.loads(text)["class"] == "tests.concurrency_jobs:Limited"


def test_a_class_another_process_cannot_import_is_refused() -> None:
    class Local(UniqueJob):
        def perform(self) -> None: ...

    with pytest.raises(UnstorableCallError, match="defined inside a function"):
        class_path(Local)
    Local.__module__ = "__main__"
    Local.__qualname__ = "Local"
    with pytest.raises(UnstorableCallError, match="defined in __main__"):
        class_path(Local)
    Local.__module__ = "tests.concurrency_jobs"
    Local.__qualname__ = "Limited"
    with pytest.raises(UnstorableCallError, match="not the object found at that import path"):
        class_path(Local)
    Local.__qualname__ = "NoSuchJob"
    with pytest.raises(UnstorableCallError, match="cannot be imported by its name"):
        class_path(Local)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "not JSON"),
        ('{"format": 99}', "format 99, this version reads 1"),
        ('{"format": 1, "class": "tests.nowhere:Job"}', "cannot be imported"),
        ('{"format": 1, "class": "json:JSONDecoder"}', "is not a UniqueJob"),
        (
            '{"format": 1, "class": "tests.concurrency_jobs:Limited", "args": [{"$": "what", "v": 1}]}',
            "unknown tag",
        ),
        (
            '{"format": 1, "class": "tests.concurrency_jobs:Limited", "args": [{"$": "uuid", "v": "x"}]}',
            "bad 'uuid'",
        ),
        ('{"format": 1, "class": "tests.concurrency_jobs:Limited", "args": {}}', "args must be a list"),
    ],
)
def test_a_damaged_stored_call_is_a_clear_error(text: str, message: str) -> None:
    with pytest.raises(UnstorableCallError, match=message):
        decode_call(text)


def test_errors_pickle() -> None:
    for error in (UnstorableCallError("args[0]", "bad"), ConcurrencyLimitExceeded("k", 3, 1.5)):
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
    limited = ConcurrencyLimitExceeded("jobs.X:acct-1", 3)
    assert (limited.key, limited.limit, limited.waited) == ("jobs.X:acct-1", 3, None)
    assert str(limited) == "concurrency key 'jobs.X:acct-1' is at its limit of 3"
    assert "after waiting 1.5s" in str(ConcurrencyLimitExceeded("k", 1, 1.5))
    assert isinstance(UnstorableCallError("", "x"), TypeError)
