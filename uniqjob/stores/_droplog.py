"""The file store's dropped duplicates: an append-only log per stripe, ``.NN.drops``, one line per count.

A count is appended, ``[minute, n, class]`` (a dropped duplicate) or ``[minute, n, class,
kind]`` (kind "c" coalesced, "r" replaced: see ``_drops``) as a line of JSON, under the stripe's
lock, so in the same step as the refusal it counts: one ``write`` to a file
opened ``O_APPEND``, never a rewrite, since duplicates are the common case of a
busy queue. A log past :data:`COMPACT` bytes is rewritten (a new file renamed
over it) with one line per class and minute still kept. Counts are for people:
a line or a file that cannot be read is logged and skipped, a log that cannot
be written is logged, and neither ever fails a lock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from ._drops import BUCKET, KEEP, KINDS, Counts, add, bucket_minute, minute
from ._files import read_all
from ._log import get_logger
from ._stripes import FILE_MODE, OPEN_FLAGS, describe_error, file_problem

__all__ = ["COMPACT", "DropLog"]

log = get_logger(__name__)

#: A log longer than this (bytes) is compacted at its next count.
COMPACT = 16 * 1024


class DropLog:
    """The ``.NN.drops`` logs of one store directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path(self, stripe: int) -> str:
        return os.path.join(self.directory, f".{stripe:02d}.drops")

    def add(self, stripe: int, cls: str, now: float, n: int, kind: str = "") -> None:
        """Append a count of ``n`` (-1: one taken back) for ``cls`` of ``kind`` at ``now``; the stripe's
        lock is held."""
        if not cls:
            return
        path = self.path(stripe)
        # The newline first: a line cut short by a crash mid-append then ends where this one starts.
        line = "\n" + _line(minute(now), n, cls, kind)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | OPEN_FLAGS, FILE_MODE)
            try:
                info = os.fstat(fd)
                problem = file_problem(info)
                if problem:
                    log.warning("not counting a duplicate in %s: it is %s", path, problem)
                    return
                os.write(fd, line.encode("utf-8", "surrogateescape"))
                size = info.st_size + len(line)
            finally:
                os.close(fd)
            if size > COMPACT:
                self._compact(path, now)
        except OSError as exc:
            log.warning("not counting a duplicate: %s", describe_error(path, exc))

    def _compact(self, path: str, now: float) -> None:
        """Rewrite the log at ``path`` as one line per class and minute still kept."""
        lines = ""
        for cls, buckets in self.read(path, now).items():
            for b, c in buckets.items():
                m = bucket_minute(b) or 0
                lines += _line(m, c, cls, b[len(str(m)) :]) + "\n"
        fresh = path + ".new"
        fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | OPEN_FLAGS, FILE_MODE)
        try:
            os.write(fd, lines.encode("utf-8", "surrogateescape"))
        finally:
            os.close(fd)
        os.replace(fresh, path)

    def read(self, path: str, now: float) -> Counts:
        """The counts of the log at ``path`` still kept at ``now``, summed per class and minute."""
        counts: Counts = {}
        oldest = minute(now) - KEEP // BUCKET
        for m, n, cls, kind in self._lines(path):
            if m >= oldest:
                add(counts, cls, m * BUCKET, n, kind)
        return counts

    def _lines(self, path: str) -> Iterator[tuple[int, int, str, str]]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("skipping dropped-duplicate counts: %s", describe_error(path, exc))
            return
        try:
            problem = file_problem(os.fstat(fd))
            if problem:
                log.warning("skipping dropped-duplicate counts %s: it is %s", path, problem)
                return
            raw = read_all(fd)
        finally:
            os.close(fd)
        bad = 0
        for text in raw.splitlines():
            if not text:
                continue
            try:
                m, n, cls, *kind = json.loads(text)
            except (ValueError, TypeError):
                bad += 1
                continue
            k = kind[0] if len(kind) == 1 else ""
            if type(m) is int and type(n) is int and isinstance(cls, str) and k in KINDS and len(kind) < 2:
                yield m, n, cls, k
            else:
                bad += 1
        if bad:  # a line cut short by a crash mid-append, or a damaged file
            log.warning("skipped %d unreadable line(s) of dropped-duplicate counts in %s", bad, path)


def _line(m: int, n: int, cls: str, kind: str) -> str:
    """A log line: ``[minute, n, class]``, with the kind's letter after them if it has one."""
    return json.dumps([m, n, cls, kind] if kind else [m, n, cls], separators=(",", ":"))
