"""Timing primitives: operations sampled alternately with their floor, and summaries.

Each sample times the floor and the operation back to back, so drift of the
machine (other tenants, CPU frequency, a busy disk) hits both alike and their
ratio stays meaningful. The floor is timed after another floor call, never
right after the operation: an operation leaves work behind (the disk's deferred
writes, caches it evicted) that would otherwise inflate the floor and flatter
the ratio. That leftover is timed too, and charged to the operation.
"""

from __future__ import annotations

import gc
import inspect
import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

__all__ = ["Op", "Paired", "Stats", "ainterleaved", "interleaved", "rounds", "summarize"]

#: One operation: called once per sample, it makes its own fresh keys. If it
#: returns a callable, that is called after the sample, off the clock: an
#: operation that only adds locks undoes them there, so the store keeps its size
#: (as a store does whose jobs come and go) instead of growing for the whole run.
Op = Callable[[], object]


@dataclass(frozen=True)
class Stats:
    """Median and 99th percentile of one series of samples, in microseconds."""

    median_us: float
    p99_us: float
    n: int


def summarize(samples_ns: list[int]) -> Stats:
    """Return the median and nearest-rank p99 of ``samples_ns`` (nanoseconds) in microseconds."""
    if not samples_ns:
        raise ValueError("no samples to summarize")
    s = sorted(samples_ns)
    n = len(s)
    median = (s[(n - 1) // 2] + s[n // 2]) / 2
    p99 = s[max(0, math.ceil(0.99 * n) - 1)]
    return Stats(median / 1000, p99 / 1000, n)


@dataclass(frozen=True)
class Paired:
    """One operation's samples and its floor's: clean, and right after the operation."""

    floor: Stats  # the floor after a floor: its clean cost
    op: Stats  # the operation, after a floor
    after: Stats  # the floor right after the operation

    @property
    def left_behind_us(self) -> float:
        """What the operation leaves for the next call (deferred disk work, cold caches), µs."""
        return max(0.0, self.after.median_us - self.floor.median_us)

    @property
    def cost_us(self) -> float:
        """The operation's median plus what it leaves behind, µs."""
        return self.op.median_us + self.left_behind_us

    @property
    def ratio(self) -> float:
        """The operation's cost over the clean floor's median."""
        return self.cost_us / self.floor.median_us


def interleaved(series: Sequence[tuple[Op, Op]], iterations: int, warmup: int) -> list[Paired]:
    """Time each (floor, op) pair alternately, all pairs round-robin; return their samples.

    Each sample runs floor (untimed), floor, op, floor: the first timed floor is
    clean, the op runs after a floor like the floor itself, and the last floor
    shows what the op left behind. Round-robin over every pair, rather than one
    pair after another, puts every operation under the same conditions.
    """
    plan = _plan(series, iterations, warmup)
    call = next(plan)
    while True:
        try:
            call = plan.send(call())
        except StopIteration as done:
            result: list[Paired] = done.value
            return result


async def ainterleaved(series: Sequence[tuple[Op, Op]], iterations: int, warmup: int) -> list[Paired]:
    """:func:`interleaved` for coroutine functions (and an op's undo): each call is awaited."""
    plan = _plan(series, iterations, warmup)
    call = next(plan)
    while True:
        answer = call()
        if inspect.isawaitable(answer):
            answer = await answer
        try:
            call = plan.send(answer)
        except StopIteration as done:
            result: list[Paired] = done.value
            return result


def _plan(
    series: Sequence[tuple[Op, Op]], iterations: int, warmup: int
) -> Generator[Callable[[], object], object, list[Paired]]:
    """The calls of :func:`interleaved`, yielded to be made (each is sent back its answer), and timed."""
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")
    for _ in range(warmup):
        for floor, op in series:
            yield floor
            undo = yield op
            if callable(undo):
                yield undo
    clock = time.perf_counter_ns
    samples = [([0] * iterations, [0] * iterations, [0] * iterations) for _ in series]
    gc.collect()
    for i in range(iterations):
        for (floor, op), (floor_ns, op_ns, after_ns) in zip(series, samples, strict=True):
            yield floor
            t0 = clock()
            yield floor
            t1 = clock()
            undo = yield op
            t2 = clock()
            yield floor
            t3 = clock()
            floor_ns[i], op_ns[i], after_ns[i] = t1 - t0, t2 - t1, t3 - t2
            if callable(undo):
                yield undo
    return [Paired(summarize(f), summarize(o), summarize(a)) for f, o, a in samples]


def rounds(groups: Sequence[Sequence[Op]], iterations: int, warmup: int) -> list[list[Stats]]:
    """Time every operation of every group once a round; return each one's summary, by group.

    The operations of a group (an operation and its floor, say) run back to back,
    in alternating order from one round to the next, so neither always runs first;
    the groups follow one another in every round, so drift of the machine hits
    them all alike. An operation's undo (what it returns, if callable) runs after
    its sample, off the clock.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be at least 1, got {iterations}")
    for _ in range(warmup):
        for group in groups:
            for op in group:
                undo = op()
                if callable(undo):
                    undo()
    clock = time.perf_counter_ns
    samples = [[[0] * iterations for _ in group] for group in groups]
    orders = [(list(range(len(group))), list(reversed(range(len(group))))) for group in groups]
    gc.collect()
    for i in range(iterations):
        for group, series, order in zip(groups, samples, orders, strict=True):
            for j in order[i % 2]:
                t0 = clock()
                undo = group[j]()
                series[j][i] = clock() - t0
                if callable(undo):
                    undo()
    return [[summarize(s) for s in series] for series in samples]
