"""Canonical encoding and lock keys: one call, one key; different values, different keys."""

from __future__ import annotations

import array
import datetime as dt
import enum
import uuid
from decimal import Context, Decimal, localcontext
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from uniqjob import UniqueJob, UniqueKeyError
from uniqjob.keys import KEY_VERSION, canonical, digest


class Color(enum.Enum):
    RED = 1


class Level(enum.IntEnum):
    LOW = 1


class Job(UniqueJob):
    def perform(self, a: Any, b: Any = 2, *rest: Any, **extra: Any) -> None:
        pass


def test_bound_to_signature_with_defaults() -> None:
    assert Job.lock_key(1) == Job.lock_key(a=1) == Job.lock_key(1, 2) == Job.lock_key(1, b=2)
    assert Job.lock_key(1) != Job.lock_key(1, 3)
    assert Job.lock_key(1, 2, 3) != Job.lock_key(1, 2)
    assert Job.lock_key(1, c=1) != Job.lock_key(1)


def test_key_names_class_and_version() -> None:
    key = Job.lock_key(1)
    assert key.startswith(f"{__name__}.Job:{KEY_VERSION}:")
    assert len(key.rsplit(":", 1)[1]) == 32


@pytest.mark.parametrize(
    "values",
    [
        (1, "1", 1.0, True, b"1", Decimal(1), Level.LOW),
        (0, False, None, "", 0.0, b"", [], {}),
        (Color.RED, 1, Level.LOW),
    ],
)
def test_type_aware(values: tuple[Any, ...]) -> None:
    keys = {Job.lock_key(v) for v in values}
    assert len(keys) == len(values)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"x": 1, "y": 2}, {"y": 2, "x": 1}),
        ({1, 2, 3}, {3, 2, 1}),
        (frozenset({1, 2}), {2, 1}),
        ([1, (2, 3)], (1, [2, 3])),
        (Decimal("1.5"), Decimal("1.50")),
        (Decimal("0"), Decimal("-0.00")),
        (0.0, -0.0),
        (
            dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC),
            dt.datetime(2026, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        ),
        (uuid.UUID(int=5), uuid.UUID(int=5)),
        (bytearray(b"ab"), b"ab"),
    ],
)
def test_equal_values_one_key(a: Any, b: Any) -> None:
    assert Job.lock_key(a) == Job.lock_key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (dt.datetime(2026, 1, 1, 12), dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)),
        (dt.date(2026, 1, 1), dt.datetime(2026, 1, 1)),
        (dt.time(1, 2), dt.time(1, 2, tzinfo=dt.UTC)),
        ([1, 2], [2, 1]),
        ({"a": 1}, {"a": 1.0}),
        ({"a": [1]}, {"a": {1}}),
        (["ab", "c"], ["a", "bc"]),
        ({"a": "b"}, {"ab": ""}),
        ("x", b"x"),
        (Decimal("1.5"), 1.5),
    ],
)
def test_different_values_different_keys(a: Any, b: Any) -> None:
    assert Job.lock_key(a) != Job.lock_key(b)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (object(), "a"),
        (float("nan"), "a"),
        (Decimal("NaN"), "a"),
        ({"user": object()}, 'a["user"]'),
        ({"user": [1, {"deep": float("nan")}]}, 'a["user"][1]["deep"]'),
        ([1, 2, object()], "a[2]"),
        ({1: {2: object()}}, "a[1][2]"),
    ],
)
def test_unsupported_values_name_their_path(value: Any, path: str) -> None:
    with pytest.raises(UniqueKeyError) as info:
        Job.lock_key(value)
    assert info.value.path == path
    assert str(info.value).startswith(path + ":")
    assert "0x" not in str(info.value)  # never a memory address


def test_unbindable_arguments() -> None:
    with pytest.raises(UniqueKeyError, match="missing a required argument: 'a'") as info:
        Job.lock_key()
    assert info.value.path == "a"

    class Strict(UniqueJob):
        def perform(self, a: int) -> None:
            pass

    with pytest.raises(UniqueKeyError, match="unexpected keyword argument 'z'") as info:
        Strict.lock_key(1, z=2)
    assert info.value.path == "z"
    with pytest.raises(UniqueKeyError, match="too many positional arguments"):
        Strict.lock_key(1, 2)


def test_unique_args_subset() -> None:
    class Export(UniqueJob):
        unique_args = ("account_id",)

        def perform(self, account_id: int, note: str = "") -> None:
            pass

    assert Export.lock_key(1, "a") == Export.lock_key(1, note="b") == Export.lock_key(account_id=1)
    assert Export.lock_key(1) != Export.lock_key(2)
    # only the chosen arguments need to be encodable
    assert Export.lock_key(1, object()) == Export.lock_key(1)


def test_unique_key_classmethod() -> None:
    class Sync(UniqueJob):
        @classmethod
        def unique_key(cls, account: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            return account["id"]

        def perform(self, account: dict[str, Any], note: str = "") -> None:
            pass

    assert Sync.lock_key({"id": 7, "name": "a"}) == Sync.lock_key({"id": 7, "name": "b"}, "x")
    assert Sync.lock_key({"id": 7}) != Sync.lock_key({"id": 8})

    class Bad(UniqueJob):
        @classmethod
        def unique_key(cls, *args: Any, **kwargs: Any) -> Any:
            return object()

        def perform(self) -> None:
            pass

    with pytest.raises(UniqueKeyError) as info:
        Bad.lock_key()
    assert info.value.path == "unique_key()"


def test_perform_kinds_share_binding() -> None:
    class Static(UniqueJob):
        @staticmethod
        def perform(a: int, b: int = 1) -> None:
            pass

    class Cls(UniqueJob):
        @classmethod
        def perform(cls, a: int, b: int = 1) -> None:
            pass

    for job in (Static, Cls):
        assert job.lock_key(1) == job.lock_key(a=1, b=1)
        with pytest.raises(UniqueKeyError):
            job.lock_key(1, 2, 3)


def test_subclass_has_its_own_keys() -> None:
    class Child(Job):
        pass

    assert Child.lock_key(1) != Job.lock_key(1)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.decimals(allow_nan=False)
    | st.uuids()
    | st.datetimes(timezones=st.none() | st.timezones())
    | st.times(timezones=st.none() | st.timezones()),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        | st.frozensets(st.integers() | st.text(max_size=5), max_size=4)
    ),
    max_leaves=12,
)


@given(_values)
def test_encoding_is_stable_and_order_free(value: Any) -> None:
    assert canonical(value) == canonical(value)
    if isinstance(value, dict):
        assert canonical(dict(reversed(list(value.items())))) == canonical(value)
    if isinstance(value, list):
        assert canonical(tuple(value)) == canonical(value)


@given(_values, _values)
def test_different_encodings_mean_unequal_values(a: Any, b: Any) -> None:
    # The digest may only merge values that are equal; it never merges by accident.
    if canonical(a) == canonical(b):
        assert digest(a) == digest(b)
    if type(a) is type(b) and isinstance(a, (int, str, bytes, Decimal, uuid.UUID, dt.time)) and a == b:
        assert canonical(a) == canonical(b)


@given(st.times(timezones=st.timezones()), st.times(timezones=st.timezones()))
def test_equal_aware_times_are_one_key(a: dt.time, b: dt.time) -> None:
    assert (canonical(a) == canonical(b)) == (a == b)


@given(st.decimals(allow_nan=False), st.integers(1, 40), st.booleans())
def test_a_decimal_key_ignores_the_callers_context(value: Decimal, precision: int, capitals: bool) -> None:
    expected = canonical(value)
    with localcontext(Context(prec=precision, capitals=int(capitals))):
        assert canonical(value) == expected


def test_values_that_cannot_be_keyed_faithfully_are_refused_by_name() -> None:
    ints = memoryview(array.array("i", [1]))
    with pytest.raises(UniqueKeyError, match=r"payload\[0\].*memoryview of 'i' items"):
        canonical([ints], "payload")
    assert canonical(memoryview(b"ab")) == canonical(b"ab")  # a view of bytes is its bytes
    late = dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-1)))
    with pytest.raises(UniqueKeyError, match="out of range once moved to UTC"):
        canonical({"when": late}, "call")
