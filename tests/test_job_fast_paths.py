"""The job layer's fast paths give exactly what the general code they skip gives."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from uniqjob import JobLock, JobNotUnique, UniqueJob, UniqueKeyError
from uniqjob._calls import binder, describe_call, preview, show
from uniqjob.keys import KeyPlan, make_key
from uniqjob.locks import QueueMeta
from uniqjob.stores.base import Backend
from uniqjob.stores.memory import MemoryBackend

_NAMES = ("a", "b", "c", "d")
_MISSING = inspect.Parameter.empty


@st.composite
def _signatures(draw: st.DrawFn) -> inspect.Signature:
    count = draw(st.integers(0, len(_NAMES)))
    first_default = draw(st.integers(0, count))  # defaults trail, as Python requires
    params = [
        inspect.Parameter(
            name,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=draw(st.integers()) if i >= first_default else _MISSING,
        )
        for i, name in enumerate(_NAMES[:count])
    ]
    return inspect.Signature(params)


_calls = st.tuples(
    st.lists(st.integers(), max_size=5),
    st.dictionaries(st.sampled_from((*_NAMES, "z")), st.integers(), max_size=4),
)


@given(_signatures(), _calls)
def test_fast_binding_is_signature_bind(signature: inspect.Signature, call: Any) -> None:
    args, kwargs = call
    bind = binder(signature)
    assert bind is not None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        assert bind(args, kwargs) is None  # the caller then asks bind() for its error
        return
    bound.apply_defaults()
    fast = bind(args, kwargs)
    assert fast == bound.arguments
    assert fast is not None and list(fast) == list(bound.arguments)  # and in the same order


_values = st.one_of(
    st.integers(), st.text(max_size=8), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)
)
_names = st.lists(st.text(min_size=1, max_size=6), min_size=0, max_size=5, unique=True)


@given(_names, st.data())
@pytest.mark.slow
def test_a_planned_key_is_make_key(names: list[str], data: st.DataObject) -> None:
    values = [data.draw(_values) for _ in names]
    assert KeyPlan(names).key("job", values) == make_key("job", dict(zip(names, values, strict=True)))


@given(_calls)
def test_the_fast_lock_key_is_the_general_one(call: Any) -> None:
    args, kwargs = call

    class Planned(UniqueJob):
        unique_backend = MemoryBackend()

        def perform(self, a: int, b: int = 2, c: int = 3) -> None:
            pass

    assert Planned._plan.key is not None
    try:
        general = make_key(Planned.job_name(), Planned.unique_key(*args, **kwargs))
    except UniqueKeyError:
        with pytest.raises(UniqueKeyError):
            Planned.lock_key(*args, **kwargs)
        return
    assert Planned.lock_key(*args, **kwargs) == general


_previewed = st.one_of(
    st.integers(),
    st.integers(-(10**60), 10**60),
    st.text(),
    st.text(min_size=35, max_size=45),
    st.booleans(),
    st.floats(),
)


@given(_previewed)
def test_fast_preview_is_reprlib(value: Any) -> None:
    assert show(value) == preview.repr(value)


def _star(*args: Any) -> None: ...
def _kw_only(a: int, *, b: int = 1) -> None: ...
def _pos_only(a: int, /, b: int = 1) -> None: ...
def _double_star(a: int, **kwargs: Any) -> None: ...


@pytest.mark.parametrize("fn", [_star, _kw_only, _pos_only, _double_star])
def test_other_signatures_are_left_to_bind(fn: Any) -> None:
    assert binder(inspect.signature(fn)) is None


class _Report(UniqueJob):
    unique_backend = MemoryBackend()

    def perform(self, account_id: int, kind: str = "daily") -> None:
        """Nothing: these tests are about keys and conflicts."""


def test_keys_and_errors_are_those_of_bind() -> None:
    key = _Report.lock_key(1)
    assert key == _Report.lock_key(1, "daily") == _Report.lock_key(account_id=1)
    assert key == _Report.lock_key(1, kind="daily")
    with pytest.raises(UniqueKeyError, match="multiple values for argument 'account_id'"):
        _Report.lock_key(1, account_id=2)
    with pytest.raises(UniqueKeyError, match="unexpected keyword argument 'nope'"):
        _Report.lock_key(1, nope=2)
    with pytest.raises(UniqueKeyError, match="missing a required argument: 'account_id'"):
        _Report.lock_key()
    with pytest.raises(UniqueKeyError, match="too many positional arguments"):
        _Report.lock_key(1, "x", 3)


def test_a_duplicate_describes_its_holder_only_when_told(caplog: pytest.LogCaptureFixture) -> None:
    class Held(_Report):
        pass

    described: list[int] = []
    assert Held.before_enqueue(1)
    lock = Held.lock(1)
    assert not lock.acquire()
    conflict = lock.conflict
    assert conflict is not None
    original = type(conflict).describe

    def counting(self: Any) -> dict[str, object]:
        described.append(1)
        return original(self)

    caplog.set_level(logging.WARNING, logger="uniqjob")
    try:
        type(conflict).describe = counting  # type: ignore[method-assign]
        assert not Held.before_enqueue(1)  # dropped, and nobody reads the holder's facts
        assert described == []
        caplog.set_level(logging.INFO, logger="uniqjob")
        assert not Held.before_enqueue(1)
        assert described == [1] and "already locked (queued, taken " in caplog.text
        Held.unique_on_conflict = "raise"
        with pytest.raises(JobNotUnique) as raised:
            Held.before_enqueue(1)
        assert raised.value.holder["state"] == "queued"
    finally:
        type(conflict).describe = original  # type: ignore[method-assign]


def _described_slowly(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [preview.repr(a) for a in args[:6]] + [
        f"{k}={preview.repr(v)}" for k, v in list(kwargs.items())[:6]
    ]
    text = ", ".join(parts)
    return text if len(text) <= 200 else text[:197] + "..."


_arguments = st.one_of(_previewed, st.lists(st.text(min_size=30, max_size=50), max_size=8))


@given(st.lists(_arguments, max_size=8), st.dictionaries(st.sampled_from(_NAMES), _arguments, max_size=4))
def test_a_call_s_preview_is_the_general_one(args: list[Any], kwargs: dict[str, Any]) -> None:
    assert describe_call(tuple(args), kwargs) == _described_slowly(tuple(args), kwargs)


def _facts(lock: JobLock) -> tuple[Any, ...]:
    return (
        lock.backend, lock.key, lock.lease, lock.ttl, lock.meta, lock.strategy, lock.limit, lock.adopt,
        lock.on_lost,
    )  # fmt: skip


def _lost(lock: JobLock) -> None:
    """Nothing: a setting to compare."""


class _Plain(UniqueJob):
    unique_backend = "memory://"
    unique_lock_autoexpire = 90
    unique_run_lease = 12
    unique_strategy = "until_and_while_executing"
    unique_lock_limit = 2
    unique_on_lost = _lost

    def perform(self, a: int, b: int = 2, c: int = 3) -> None:
        pass


class _Hooked(_Plain):
    """_Plain with every hook that makes a lock overridden, each by the inherited one."""

    @classmethod
    def lock(cls, *args: Any, **kwargs: Any) -> JobLock:
        return super().lock(*args, **kwargs)

    @classmethod
    def lock_key(cls, *args: Any, **kwargs: Any) -> str:
        return super().lock_key(*args, **kwargs)

    @classmethod
    def unique_key(cls, *args: Any, **kwargs: Any) -> Any:
        return super().unique_key(*args, **kwargs)

    @classmethod
    def job_name(cls) -> str:
        return super().job_name()

    @classmethod
    def backend(cls) -> Backend:
        return super().backend()

    @classmethod
    def autoexpire(cls) -> float | None:
        return super().autoexpire()


_Hooked.__qualname__ = _Plain.__qualname__  # the same name, so the same keys


@given(_calls, st.booleans())
def test_the_plain_lock_is_the_one_the_hooks_make(call: Any, adopt: bool) -> None:
    args, kwargs = call
    assert _Plain._plan.plain and not _Hooked._plan.plain
    try:
        general = _Hooked.lock(*args, **kwargs)
    except UniqueKeyError:
        with pytest.raises(UniqueKeyError):
            _Plain.lock(*args, **kwargs)
        return
    assert _facts(_Plain.lock(*args, **kwargs)) == _facts(general)
    rebuilt = _Plain.lock_from(general.key, general.token, adopt=adopt)
    assert _facts(rebuilt) == _facts(_Hooked.lock_from(general.key, general.token, adopt=adopt))
    assert rebuilt.token == general.token and rebuilt.meta == QueueMeta(_Plain.job_name(), "")


def test_a_setting_assigned_after_the_class_is_defined_counts() -> None:
    class Late(UniqueJob):
        unique_backend = "memory://"

        def perform(self, a: int) -> None:
            pass

    Late.unique_run_lease = 7
    Late.unique_lock_autoexpire = 60
    Late.unique_lock_limit = 3
    Late.__qualname__ = "Renamed"
    lock = Late.lock(1)
    assert (lock.lease, lock.ttl, lock.limit) == (7.0, 60.0, 3)
    assert lock.key.startswith(f"{__name__}.Renamed:") and lock.meta.cls == f"{__name__}.Renamed"
    assert Late.lock_from(lock.key, lock.token).lease == 7.0


def test_a_class_that_overrides_a_hook_is_not_plain_but_one_that_only_names_itself_is() -> None:
    class Named(UniqueJob):
        @classmethod
        def job_name(cls) -> str:
            return "renamed"

        def perform(self, a: int) -> None:
            pass

    class Keyed(Named):
        @classmethod
        def lock_key(cls, *args: Any, **kwargs: Any) -> str:
            return super().lock_key(*args, **kwargs)

    assert Named._plan.plain and Named._plan.named and not Keyed._plan.plain
    assert Named.lock(1).key == Keyed.lock(1).key == make_key("renamed", {"a": 1})
    assert Named.lock(1).meta.cls == Keyed.lock(1).meta.cls == "renamed"
