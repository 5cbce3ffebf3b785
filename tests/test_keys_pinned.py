"""Known answers for the lock-key encoding: the exact bytes, digests and keys of KEY_VERSION 1.

tests/test_keys.py checks the encoding's properties (type-aware, order-free, ...);
this module pins its output. Keys live in backends across deploys, so a library
that makes a different key for the same call lets duplicates through while old
and new versions run side by side. Any change here must come with a bump of
``uniqjob.keys.KEY_VERSION`` (which is part of every key) and a migration note.

The expected values were computed from the committed code, not from this module.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from decimal import Decimal
from http import HTTPStatus
from typing import Any

import pytest

from uniqjob import UniqueJob
from uniqjob.keys import KEY_VERSION, canonical, digest, make_key

PINNED_VERSION = 1

_BUMP = (
    "the lock-key encoding changed, so this version's keys no longer match the keys held by "
    "the previous one and duplicates slip through during an upgrade. If that is intended, bump "
    "uniqjob.keys.KEY_VERSION, re-pin the values in tests/test_keys_pinned.py and document the "
    "migration; otherwise restore the old encoding"
)


def _changed(what: str) -> str:
    return f"{what}: {_BUMP}"


def test_key_version_is_pinned() -> None:
    assert KEY_VERSION == PINNED_VERSION, (
        f"KEY_VERSION is {KEY_VERSION}, these values were pinned for {PINNED_VERSION}: re-pin every "
        "value in this module against the new encoding, set PINNED_VERSION and document the migration"
    )


# -- canonical() -------------------------------------------------------------------------

CANONICAL = [
    pytest.param(None, b"n", id="none"),
    pytest.param(True, b"T", id="true"),
    pytest.param(False, b"F", id="false"),
    pytest.param(0, b"i0;", id="int-0"),
    pytest.param(1, b"i1;", id="int-1"),
    pytest.param(-7, b"i-7;", id="int-neg"),
    pytest.param(2**70, b"i1180591620717411303424;", id="int-big"),
    pytest.param(1.0, b"f0x1.0000000000000p+0;", id="float-1"),
    pytest.param(0.0, b"f0x0.0p+0;", id="float-0"),
    pytest.param(-0.0, b"f0x0.0p+0;", id="float-neg-0"),
    pytest.param(0.1, b"f0x1.999999999999ap-4;", id="float-0.1"),
    pytest.param(float("inf"), b"finf;", id="float-inf"),
    pytest.param(float("-inf"), b"f-inf;", id="float-neg-inf"),
    pytest.param("", b"s0:", id="str-empty"),
    pytest.param("abc", b"s3:abc", id="str-ascii"),
    pytest.param("é", b"s2:\xc3\xa9", id="str-e-acute"),
    pytest.param("東京", b"s6:\xe6\x9d\xb1\xe4\xba\xac", id="str-cjk"),
    pytest.param("\ud800", b"s3:\xed\xa0\x80", id="str-lone-surrogate"),
    pytest.param(b"\x00", b"b1:\x00", id="bytes-nul"),
    pytest.param(b"", b"b0:", id="bytes-empty"),
    pytest.param(bytearray(b"ab"), b"b2:ab", id="bytearray"),
    pytest.param(memoryview(b"ab"), b"b2:ab", id="memoryview"),
    pytest.param([1, "a"], b"l2:i1;s1:a", id="list"),
    pytest.param((1, "a"), b"l2:i1;s1:a", id="tuple-as-list"),
    pytest.param([], b"l0:", id="list-empty"),
    pytest.param([1, [2, (3,)]], b"l2:i1;l2:i2;l1:i3;", id="nested-list"),
    pytest.param({"b": 2, "a": 1}, b"d2:s1:ai1;s1:bi2;", id="dict"),
    pytest.param({"a": 1, "b": 2}, b"d2:s1:ai1;s1:bi2;", id="dict-reordered"),
    pytest.param({}, b"d0:", id="dict-empty"),
    # pairs sort by their encoded bytes, so the shorter key comes first
    pytest.param({"ab": 1, "b": 2}, b"d2:s1:bi2;s2:abi1;", id="dict-key-lengths"),
    pytest.param({1: "a", "1": "a", None: 0}, b"d3:i1;s1:ani0;s1:1s1:a", id="dict-non-str-keys"),
    pytest.param(
        {"outer": {"inner": [1, {"x": None}], "flag": False}, "n": 1.5},
        b"d2:s1:nf0x1.8000000000000p+0;s5:outerd2:s4:flagFs5:innerl2:i1;d1:s1:xn",
        id="dict-nested",
    ),
    pytest.param({3, 1, 2}, b"S3:i1;i2;i3;", id="set"),
    pytest.param(frozenset({2, 3, 1}), b"S3:i1;i2;i3;", id="frozenset"),
    pytest.param({"b", 1, None}, b"S3:i1;ns1:b", id="set-mixed"),
    pytest.param(set(), b"S0:", id="set-empty"),
    pytest.param(dt.datetime(2026, 1, 1, 12, 30), b"Dn2026-01-01T12:30:00;", id="datetime-naive"),
    pytest.param(dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC), b"Da2026-01-01T12:00:00;", id="datetime-utc"),
    pytest.param(
        dt.datetime(2026, 1, 1, 13, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        b"Da2026-01-01T12:00:00;",
        id="datetime-plus-1h",
    ),
    pytest.param(
        dt.datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=dt.UTC),
        b"Da2026-01-01T12:00:00.000005;",
        id="datetime-micro",
    ),
    pytest.param(dt.date(2026, 1, 1), b"Y2026-01-01;", id="date"),
    pytest.param(dt.time(1, 2, 3), b"H01:02:03;", id="time"),
    # Aware times encode the time of day less the offset, as Python compares them
    # (changed from the ISO text with its offset: equal times had two keys).
    pytest.param(dt.time(1, 2, tzinfo=dt.UTC), b"Ha3720.000000;", id="time-utc"),
    pytest.param(
        dt.time(2, 2, 0, 7, tzinfo=dt.timezone(dt.timedelta(hours=1))), b"Ha3720.000007;", id="time-plus-one"
    ),
    pytest.param(Decimal("1." + "1" * 40), b"M1." + b"1" * 40 + b";", id="decimal-beyond-28-digits"),
    pytest.param(Decimal("1.50"), b"M1.5;", id="decimal"),
    pytest.param(Decimal("1.5"), b"M1.5;", id="decimal-normalised"),
    pytest.param(Decimal("-0.00"), b"M0;", id="decimal-neg-zero"),
    pytest.param(Decimal("100"), b"M1E+2;", id="decimal-100"),
    pytest.param(Decimal("-Infinity"), b"M-Infinity;", id="decimal-inf"),
    pytest.param(
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        b"U12345678123456781234567812345678;",
        id="uuid",
    ),
    pytest.param(HTTPStatus.OK, b"Es15:http.HTTPStatuss2:OK", id="int-enum-stdlib"),
]


@pytest.mark.parametrize(("value", "expected"), CANONICAL)
def test_canonical_pinned(value: Any, expected: bytes) -> None:
    assert canonical(value) == expected, _changed(f"canonical({value!r}) is no longer {expected!r}")


class Color(enum.Enum):
    RED = 1


def test_canonical_enum_names_its_class() -> None:
    # The enum's module is part of its encoding, so the class name comes from this module's name.
    name = f"{__name__}.Color".encode()
    expected = b"Es%d:%bs3:RED" % (len(name), name)
    assert canonical(Color.RED) == expected, _changed(f"canonical(Color.RED) is no longer {expected!r}")
    assert canonical([Color.RED]) == b"l1:" + expected, _changed("an Enum member inside a list")


# -- digest() ----------------------------------------------------------------------------

DIGESTS = [
    pytest.param(None, "4ee3fdf7a7a38af04951408152eaad1f", id="none"),
    pytest.param(1, "0ea037d41ecc33ab3e4f1d362c009358", id="int-1"),
    pytest.param("é", "6692f3f8dee8bf9a211a907b687a6d67", id="str-e-acute"),
    pytest.param([1, "a"], "4732a4397a908c311562af2e1f88bdf4", id="list"),
    pytest.param((1, "a"), "4732a4397a908c311562af2e1f88bdf4", id="tuple"),
    pytest.param({"b": 2, "a": 1}, "1b83933d9ce1720edddfce9c6f4522e3", id="dict"),
    pytest.param(
        dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC), "132aa45673409786b7b623f2849709cd", id="datetime-utc"
    ),
    pytest.param(HTTPStatus.OK, "227fbaf6d26a3a1f65b065bdd9c4c9ca", id="int-enum-stdlib"),
]


@pytest.mark.parametrize(("value", "expected"), DIGESTS)
def test_digest_pinned(value: Any, expected: str) -> None:
    assert digest(value) == expected, _changed(f"digest({value!r}) is no longer {expected}")


# -- make_key() ----------------------------------------------------------------------------

MAKE_KEYS = [
    pytest.param({}, "jobs.Send:1:840c1a235567ab98878babc5a978e327", id="no-arguments"),
    pytest.param({"user_id": 42}, "jobs.Send:1:d321626c80f6b52fc35ddf70a4a6a24a", id="one-int"),
    pytest.param({"b": -7, "a": 1}, "jobs.Send:1:c5a35de3b49fafb65d7edbf14625fd7b", id="ints"),
    pytest.param({"email": "a@example.com"}, "jobs.Send:1:7ce2e652abb3ce9e04ff3cce10c95fdf", id="one-str"),
    pytest.param(
        {"name": "Zoë", "city": "東京"}, "jobs.Send:1:bafb1025f8fea6c6f49f8204716b13de", id="non-ascii"
    ),
    pytest.param({"année": 2026}, "jobs.Send:1:2b4b68ac430f7a98d40ebc03881faa99", id="non-ascii-name"),
    pytest.param({"n": True}, "jobs.Send:1:9884d4bdf75a1d2501d02e54f21b37e3", id="bool-not-int"),
    pytest.param({"n": 1}, "jobs.Send:1:d9665d373d4e77dceef9f463a3b97a02", id="int-not-bool"),
    pytest.param({"n": HTTPStatus.OK}, "jobs.Send:1:e3cfa063c5a6b62ff17f7d9c382e7106", id="int-enum"),
    pytest.param({"ab": 1, "b": 2}, "jobs.Send:1:3489b8dd59666a09b8a5bce343423c43", id="name-lengths"),
    pytest.param(
        {
            "id": 7,
            "when": dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC),
            "tags": ["x", "y"],
            "opts": {"force": True},
            "amount": Decimal("9.99"),
            "ref": uuid.UUID(int=5),
            "blob": b"\x00\xff",
            "ratio": 0.5,
            "none": None,
            "label": "é",
        },
        "jobs.Send:1:62642616effacf67a478148ddf652aba",
        id="mixed",
    ),
]


@pytest.mark.parametrize(("arguments", "expected"), MAKE_KEYS)
def test_make_key_pinned(arguments: dict[str, Any], expected: str) -> None:
    assert make_key("jobs.Send", arguments) == expected, _changed(
        f"make_key('jobs.Send', {arguments!r}) is no longer {expected}"
    )


def test_make_key_sorts_parameters_by_name_not_like_digest() -> None:
    # make_key orders parameters by name; canonical() orders dict pairs by their encoded
    # bytes (length prefix first). They agree when the names have equal lengths only, so
    # make_key is not digest(arguments) in general, and must not be "simplified" into it.
    same_lengths = {"b": 2, "a": 1}
    assert make_key("j", same_lengths) == "j:1:1b83933d9ce1720edddfce9c6f4522e3", _changed(
        "make_key of equal-length parameter names"
    )
    assert digest(same_lengths) == "1b83933d9ce1720edddfce9c6f4522e3", _changed("digest of the same dict")
    mixed_lengths = {"ab": 1, "b": 2}
    assert make_key("j", mixed_lengths) == "j:1:3489b8dd59666a09b8a5bce343423c43", _changed(
        "make_key's parameter order (sorted by name)"
    )
    assert digest(mixed_lengths) == "b5f59073612f0b011187d59378194811", _changed(
        "canonical()'s dict order (sorted by encoded pair)"
    )


# -- UniqueJob.lock_key ----------------------------------------------------------------------


class Send(UniqueJob):
    def perform(self, user_id: int, template: str = "welcome", urgent: bool = False) -> None:
        pass


class Batch(UniqueJob):  # *args / keyword-only / **kwargs: bound by Signature.bind, not the fast binder
    def perform(self, queue: str, *ids: int, dry_run: bool = False, **options: Any) -> None:
        pass


class Ping(UniqueJob):
    @staticmethod
    def perform(host: str, port: int = 80) -> None:
        pass


class Export(UniqueJob):
    unique_args = ("account_id", "fmt")

    def perform(self, account_id: int, fmt: str = "csv", note: str = "") -> None:
        pass


class Sync(UniqueJob):
    @classmethod
    def unique_key(cls, *args: Any, **kwargs: Any) -> Any:
        account = args[0] if args else kwargs["account"]
        return ("account", account["id"])

    def perform(self, account: dict[str, Any], full: bool = False) -> None:
        pass


class Plain(UniqueJob):
    def perform(self, ab: int, b: int) -> None:
        pass


class SameAsDefault(UniqueJob):
    # Returns what the default unique_key would, yet gets another key: a custom unique_key
    # is digest()ed, the default arguments go through make_key (see the test above).
    @classmethod
    def unique_key(cls, *args: Any, **kwargs: Any) -> Any:
        return {"ab": args[0], "b": args[1]}

    def perform(self, ab: int, b: int) -> None:
        pass


_SEND_42 = "f960dd36f0001ae0a6135e4944fbb757"
_BATCH_Q12 = "34ff31dc1119fc085b1b532c475c9444"
_PING_H = "9dc0b1efc6c32a698d3233d7cc7dc6ea"
_EXPORT_7 = "f2bcaf71554c91876827345591a65f86"
_SYNC_7 = "4d1f77a23f704057fcd38172a7ed6416"

LOCK_KEYS = [
    pytest.param(Send, "Send", (42,), {}, _SEND_42, id="send-positional"),
    pytest.param(Send, "Send", (), {"user_id": 42}, _SEND_42, id="send-keyword"),
    pytest.param(Send, "Send", (42, "welcome"), {}, _SEND_42, id="send-default-given"),
    pytest.param(
        Send, "Send", (42,), {"template": "welcome", "urgent": False}, _SEND_42, id="send-defaults-kw"
    ),
    pytest.param(
        Send, "Send", (42, "reset"), {}, "e5bf95dc0750bc5ab7ef54019aa7316f", id="send-other-template"
    ),
    pytest.param(Send, "Send", (42,), {"urgent": True}, "997654f12699058238c0d34e22e9096f", id="send-urgent"),
    pytest.param(Send, "Send", ("42",), {}, "080e20dd55fa43c70f9b1543cbb84a65", id="send-str-id"),
    pytest.param(Batch, "Batch", ("q", 1, 2), {}, _BATCH_Q12, id="batch-varargs"),
    pytest.param(Batch, "Batch", ("q", 1, 2), {"dry_run": False}, _BATCH_Q12, id="batch-kwonly-default"),
    pytest.param(
        Batch, "Batch", ("q", 1, 2), {"verbose": True}, "21866a0b5c31fe7dd15be50f930f3f65", id="batch-kw"
    ),
    pytest.param(Batch, "Batch", (), {"queue": "q"}, "7cd2c25a26a9e56d6720cc12e5d529bb", id="batch-empty"),
    pytest.param(Ping, "Ping", ("h",), {}, _PING_H, id="static-positional"),
    pytest.param(Ping, "Ping", (), {"host": "h", "port": 80}, _PING_H, id="static-keyword"),
    pytest.param(Export, "Export", (7,), {}, _EXPORT_7, id="unique-args"),
    pytest.param(Export, "Export", (7, "csv", "x"), {}, _EXPORT_7, id="unique-args-ignored-note"),
    pytest.param(Export, "Export", (7, "json"), {}, "33674dcd15a968347625c9d5ff036a0f", id="unique-args-fmt"),
    pytest.param(Sync, "Sync", ({"id": 7, "name": "a"},), {}, _SYNC_7, id="custom-unique-key"),
    pytest.param(Sync, "Sync", ({"id": 7},), {"full": True}, _SYNC_7, id="custom-unique-key-kw"),
    pytest.param(Plain, "Plain", (1, 2), {}, "3489b8dd59666a09b8a5bce343423c43", id="default-key"),
    pytest.param(
        SameAsDefault, "SameAsDefault", (1, 2), {}, "b5f59073612f0b011187d59378194811", id="custom-same-value"
    ),
]


@pytest.mark.parametrize(("job", "qualname", "args", "kwargs", "expected"), LOCK_KEYS)
def test_lock_key_pinned(
    job: type[UniqueJob], qualname: str, args: tuple[Any, ...], kwargs: dict[str, Any], expected: str
) -> None:
    # job_name() is "module.QualName": the module depends on how pytest imports this file,
    # the rest of the key does not.
    want = f"{__name__}.{qualname}:1:{expected}"
    call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
    assert job.lock_key(*args, **kwargs) == want, _changed(
        f"{qualname}.lock_key({call}) is no longer {want} (argument binding, job_name() or the encoding)"
    )


def test_lock_key_is_make_key_of_bound_arguments() -> None:
    bound = {"user_id": 42, "template": "welcome", "urgent": False}
    assert Send.lock_key(42) == make_key(f"{__name__}.Send", bound), _changed(
        "the default lock_key is no longer make_key(job_name(), arguments bound with defaults)"
    )
    batch = {"queue": "q", "ids": (1, 2), "dry_run": False, "options": {}}
    assert Batch.lock_key("q", 1, 2) == make_key(f"{__name__}.Batch", batch), _changed(
        "*args / **kwargs are no longer bound as a tuple and a dict under their parameter names"
    )


def test_custom_unique_key_is_digested() -> None:
    assert digest(("account", 7)) == _SYNC_7, _changed("digest(('account', 7))")
    assert Sync.lock_key({"id": 7}) == f"{__name__}.Sync:1:{digest(('account', 7))}", _changed(
        "a custom unique_key's key is no longer job_name():KEY_VERSION:digest(value)"
    )
