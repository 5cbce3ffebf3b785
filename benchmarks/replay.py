"""An operation's floor, made from what it sends: its commands recorded once, then replayed raw.

:func:`record` runs an operation once with the client's ``execute_command``
watched (on that client object only, and only for that call) and keeps every
command it sent with its reply. :class:`Raw` sends those same commands again
straight through redis-py's public API — an ``EVALSHA`` by ``client.evalsha``
with the recorded script and the recorded arguments, anything else by
``client.execute_command`` — on a fresh lock key each time where the operation
takes a fresh key. That is the floor: the same scripts with the same
arguments, without the library's Python around them. Because it is recorded
rather than written out by hand, the floor follows the library wherever its
script layout goes.

:func:`round_trips` counts the commands an operation sends with Redis's
``INFO commandstats``. Redis counts there the commands a script runs too
(``redis.call('HGET', ...)``), so the calls counted around the raw replay
(which sends exactly its recorded commands) are taken away first: what is left
is what the client sent.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from benchmarks.sampling import Op, summarize

__all__ = ["Raw", "Sent", "commandstats", "python_cost", "record", "round_trips", "script_names"]

_TAG = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class Sent:
    """One command an operation sent: its arguments as given to ``execute_command``, and its reply."""

    args: tuple[Any, ...]
    options: dict[str, Any]
    reply: Any


def record(client: redis.Redis, op: Op) -> tuple[list[Sent], object]:
    """Run ``op`` once; return the commands it sent through ``client`` and what it returned."""
    sent: list[Sent] = []
    send: Callable[..., Any] = client.execute_command

    def recording(*args: Any, **options: Any) -> Any:
        reply = send(*args, **options)
        sent.append(Sent(args, options, reply))
        return reply

    client.execute_command = recording  # type: ignore[method-assign]
    try:
        returned = op()
    finally:
        del client.execute_command
    return sent, returned


def kind(reply: Any) -> str:
    """A reply's kind, as far as it decides which path a script took."""
    if reply is None:
        return "nil"
    if isinstance(reply, bool | int):
        return "integer"
    if isinstance(reply, bytes | str):
        return "string"
    if isinstance(reply, list | tuple):
        return "array"
    return type(reply).__name__


def _is_evalsha(args: tuple[Any, ...]) -> bool:
    return str(args[0]).upper() == "EVALSHA"


def _keys(args: tuple[Any, ...]) -> list[Any]:
    """The key names of one recorded command: a script's KEYS, else its first argument."""
    if _is_evalsha(args):
        return list(args[3 : 3 + int(args[2])])
    return list(args[1:2])


def subject_of(sent: list[Sent]) -> str:
    """The lock key the commands were sent for: the hash tag of the first key, else the whole key."""
    keys = _keys(sent[0].args)
    if not keys:
        return ""
    first = keys[0].decode() if isinstance(keys[0], bytes) else str(keys[0])
    tag = _TAG.search(first)
    return tag.group(1) if tag else first


def script_names(module: Any | None = None) -> dict[str, str]:
    """The SHA1 of each Lua script in uniqjob's Redis script modules, to its name (for the table only)."""
    if module is not None:
        modules = [module]
    else:
        try:
            from uniqjob.stores.redis import _lua, _lua_settle, _overlap
        except ImportError:  # moved by a refactor: the table shows SHA1 prefixes instead
            return {}
        modules = [_lua, _lua_settle, _overlap]
    names = {}
    for each in modules:
        for name in getattr(each, "__all__", ()):
            source = getattr(each, name, None)
            if isinstance(source, str):
                names[hashlib.sha1(source.encode()).hexdigest()] = name
    return names


class Raw:
    """The recorded commands of one operation, sent again by redis-py's public API.

    ``fresh``: each replay takes a lock key nobody holds (the recorded key with its
    last nine characters replaced, so the same length), and returns how to delete
    what it wrote; else it is sent as recorded (a duplicate: the key stays held).
    """

    def __init__(self, client: redis.Redis, sent: list[Sent], *, fresh: bool) -> None:
        if not sent:
            raise ValueError("the operation sent no command")
        self.client = client
        self.sent = sent
        self.fresh = fresh
        self.subject = subject_of(sent)
        if fresh and len(self.subject) < 10:
            raise ValueError(f"lock key {self.subject!r} is too short to vary")
        self._ids = itertools.count()

    @property
    def commands(self) -> int:
        """How many commands one replay sends."""
        return len(self.sent)

    def describe(self, names: dict[str, str]) -> str:
        """The commands, by script name where known: ``CLAIM + START + FINISH``."""
        parts = []
        for s in self.sent:
            if _is_evalsha(s.args):
                sha = str(s.args[1])
                parts.append(names.get(sha, f"EVALSHA {sha[:8]}"))
            else:
                parts.append(str(s.args[0]).upper())
        return " + ".join(parts)

    def op(self) -> Op:
        """The floor: one replay per call (and, when ``fresh``, how to delete what it wrote)."""
        client = self.client
        evalsha = client.evalsha  # (its execute_command is looked up at each call)
        if not self.fresh:
            calls = [(_is_evalsha(s.args), s.args, s.options) for s in self.sent]
            if len(calls) == 1 and calls[0][0]:
                _, sha, numkeys, *items = calls[0][1]

                def one() -> object:
                    return evalsha(sha, numkeys, *items)

                return one

            def replay() -> object:
                for is_script, args, options in calls:
                    if is_script:
                        evalsha(args[1], args[2], *args[3:])
                    else:
                        client.execute_command(*args, **options)  # type: ignore[no-untyped-call]
                return None

            return replay

        subject, ids = self.subject, self._ids
        stem = subject[:-9] + "~"
        # Each command's arguments, with the positions that name the key split around it.
        plans = []
        for s in self.sent:
            base = list(s.args)
            split = [(i, a.split(subject)) for i, a in enumerate(base) if isinstance(a, str) and subject in a]
            plans.append((_is_evalsha(s.args), base, split, s.options))
        key_positions = [
            [i for i, _ in split if i < (3 + int(base[2]) if is_script else 2)]
            for is_script, base, split, _ in plans
        ]

        def fresh() -> Callable[[], object]:
            new = f"{stem}{next(ids):08x}"
            written: list[Any] = []
            for (is_script, base, split, options), keys in zip(plans, key_positions, strict=True):
                args = base.copy()
                for i, parts in split:
                    args[i] = new.join(parts)
                if is_script:
                    evalsha(args[1], args[2], *args[3:])
                else:
                    client.execute_command(*args, **options)  # type: ignore[no-untyped-call]
                written += [args[i] for i in keys]
            return lambda: client.delete(*set(written))

        return fresh

    def fresh_commands(self) -> tuple[list[tuple[Any, ...]], list[Any]]:
        """The recorded commands for the next fresh key, as ``execute_command`` arguments (for a
        pipeline), and the key names they write. (:meth:`op` inlines the same, for its timing.)"""
        new = f"{self.subject[:-9]}~{next(self._ids):08x}"
        commands, written = [], []
        for s in self.sent:
            args = tuple(a.replace(self.subject, new) if isinstance(a, str) else a for a in s.args)
            commands.append(args)
            written += _keys(args)
        return commands, written

    def check(self) -> None:
        """Replay once and compare each reply's kind with the recorded one's: the same path, or raise."""
        sent, undo = record(self.client, self.op())
        if callable(undo):
            undo()
        got, want = [kind(s.reply) for s in sent], [kind(s.reply) for s in self.sent]
        if got != want:
            raise RuntimeError(
                f"the raw replay of {self.describe({})} on {self.subject!r} answered {got}, "
                f"the operation was answered {want}: not the same path"
            )


def commandstats(client: redis.Redis) -> int:
    """Every command Redis has counted (``INFO commandstats``), the benchmark's own INFO left out."""
    stats: dict[str, dict[str, int]] = client.info("commandstats")
    return sum(v["calls"] for name, v in stats.items() if name != "cmdstat_info")


def _counted(client: redis.Redis, op: Op, times: int) -> int:
    before = commandstats(client)
    undos = [op() for _ in range(times)]
    after = commandstats(client)
    for undo in undos:
        if callable(undo):
            undo()
    return after - before


def round_trips(client: redis.Redis, op: Op, raw: Raw, times: int) -> float:
    """The commands ``op`` sends per call, from ``INFO commandstats`` (see the module's docstring).

    Counted over ``times`` calls of ``op`` and of ``raw``'s replay, on a server
    nobody else talks to; the undos run outside the count.
    """
    inside_scripts = _counted(client, raw.op(), times) - times * raw.commands
    return (_counted(client, op, times) - inside_scripts) / times


def python_cost(client: redis.Redis, op: Op, raw: Raw, times: int) -> float:
    """µs per call that ``op`` spends beyond its raw replay with no I/O at all: its Python (median).

    While it is measured, ``client`` sends nothing: each command is answered with
    what the recording got (a script by its SHA1; anything else, an undo's
    DEQUEUE say, with 1), so both run every line of Python they run for real,
    redis-py's command path included, but neither waits for the network or the
    server. Timed call by call in a tight loop, so with warm caches: a lower bound
    of what the library's Python adds in the rounds, where the caches go cold. The least of
    three medians each: other processes on the machine only ever add time.
    """
    answers = {
        (str(s.args[0]).upper(), s.args[1] if _is_evalsha(s.args) else None): s.reply for s in raw.sent
    }

    def answer(*args: Any, **options: Any) -> Any:
        return answers.get((str(args[0]).upper(), args[1] if _is_evalsha(args) else None), 1)

    def timed(fn: Op, n: int) -> float:
        clock, samples = time.perf_counter_ns, [0] * n
        for i in range(n):
            t0 = clock()
            undo = fn()
            samples[i] = clock() - t0
            if callable(undo):
                undo()
        return summarize(samples).median_us

    client.execute_command = answer  # type: ignore[method-assign]
    try:
        floor = raw.op()
        timed(op, min(50, times)), timed(floor, min(50, times))  # warm
        tries = [(timed(op, times), timed(floor, times)) for _ in range(3)]
        return min(mine for mine, _ in tries) - min(raw_us for _, raw_us in tries)
    finally:
        del client.execute_command
