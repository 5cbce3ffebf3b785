"""Record files: the ``<digest>.json`` file a file store keeps for each key, under its stripe's lock.

Both file stores (locks and concurrency semaphores) keep their records so,
and read, list and remove them here: never blocking on a planted FIFO, never
through a symlink, and naming the file in a :class:`CorruptRecordError`
whenever one cannot be read as far as its key. How a record is written is
each store's own (see theirs): only the error a failed write raises is shared.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import BackendError, CorruptRecordError
from ._stripes import OPEN_FLAGS, Stripes, describe_error, file_problem, os_reason

__all__ = ["RECORD_NAME", "RecordFiles", "read_all", "write_all"]

RECORD_NAME = re.compile(r"[0-9a-f]{32}\.json")  # what Stripes.of names a key's record

Record = dict[str, Any]


class RecordFiles:
    """The record files of the directory that ``stripes`` guards.

    ``kind`` says whose records they are in errors ("lock", "concurrency");
    ``problem`` says what is wrong with a record whose key was read ("" if
    nothing). ``hint_key``: whether the error for a record that cannot be
    read as far as its key names the key it was read for (its message says to
    purge that key).
    """

    def __init__(
        self, stripes: Stripes, kind: str, problem: Callable[[Record], str], *, hint_key: bool
    ) -> None:
        self.stripes = stripes
        self.kind = kind
        self.problem = problem
        self.hint_key = hint_key
        self._dir = str(stripes.directory)

    def _parse(self, path: str, key: str = "") -> Record | None:
        """Read the record at ``path`` as far as its key; None if there is none.

        Anything unreadable is a :class:`CorruptRecordError` naming the file (and ``key``, if given).
        """
        raw = self._read(path, key)
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptRecordError(path, f"not valid JSON ({exc})", key=key) from exc
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise CorruptRecordError(path, f"not a uniqjob {self.kind} record", key=key)
        return record

    def _read(self, path: str, key: str) -> bytes | None:
        """The bytes of the record file at ``path``; None if there is none, else CorruptRecordError."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | OPEN_FLAGS)  # a planted FIFO never blocks us
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CorruptRecordError(path, os_reason(exc), key=key) from exc
        try:
            # Where no other user may create files, each one is this user's: fstat() it only
            # where others may (a sticky directory), or when it reads empty (a FIFO does), to say why.
            raw = b"" if self.stripes.shared else read_all(fd)
            if not raw:
                problem = file_problem(os.fstat(fd))
                if problem:
                    raise CorruptRecordError(path, problem, key=key)
                raw = read_all(fd)
        except OSError as exc:
            raise CorruptRecordError(path, os_reason(exc), key=key) from exc
        finally:
            os.close(fd)
        return raw

    def load(self, path: str, key: str) -> Record | None:
        """Read ``key``'s record at ``path``, every field checked; None if there is none."""
        record = self._parse(path, key if self.hint_key else "")
        if record is None:
            return None
        if record["key"] != key:
            raise CorruptRecordError(path, f"holds key {record['key']!r}, expected {key!r}", key=key)
        problem = self.problem(record)
        if problem:
            raise CorruptRecordError(path, problem, key=key)
        return record

    def write_error(self, path: str, exc: OSError) -> BackendError:
        """The error for a write of the record at ``path`` that failed with ``exc`` (on it, or a spare)."""
        where = exc.filename if isinstance(exc.filename, str) else path
        return BackendError(f"cannot write {path}: {describe_error(where, exc)}", self.stripes.owner)

    def records(self) -> Iterator[Record]:
        """Yield each record that can be read as far as its key (its fields not checked)."""
        for record, _ in self._each():
            if record is not None:
                yield record

    def corrupt(self) -> Iterator[CorruptRecordError]:
        """Yield the error of each record file that cannot be read as far as its key."""
        for _, error in self._each():
            if error is not None:
                yield error

    def _each(self) -> Iterator[tuple[Record | None, CorruptRecordError | None]]:
        """Yield each record file's record (key read, fields not checked), or why it cannot be read."""
        try:
            entries = os.scandir(self.stripes.directory)
        except OSError as exc:
            raise BackendError(f"cannot list {self.stripes.directory}: {exc}", self.stripes.owner) from exc
        with entries:
            for entry in entries:
                if not RECORD_NAME.fullmatch(entry.name):
                    continue  # spares, fences, temporary and lock files, a subdirectory: no record
                try:
                    # Under its stripe's lock: never a record half written over (a spare being
                    # rewritten in place may still be open to a reader that found it under a record's name).
                    with self.stripes.locked(Stripes.of_name(entry.name)):
                        record = self._parse(entry.path)
                    if record is not None and self.stripes.of(record["key"])[0] != entry.path:
                        # Not where its key's record goes: purged by its path, never by that key.
                        raise CorruptRecordError(entry.path, f"holds key {record['key']!r} of another file")
                except CorruptRecordError as exc:
                    yield None, exc
                    continue
                if record is not None:
                    yield record, None

    def purge(self, key_or_path: str) -> list[str]:
        """Remove the record file of a key, or at a path in this directory, whatever it holds.

        Return its path, or ``[]`` if there was none. A symlink is removed, never followed.
        """
        path, stripe = self.locate(key_or_path)
        with self.stripes.locked(stripe):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise BackendError(f"cannot remove {describe_error(path, exc)}", self.stripes.owner) from exc
        return [path]

    def locate(self, key_or_path: str) -> tuple[str, int]:
        """The record file that ``key_or_path`` names (a key, or a record path here), and its stripe."""
        name = os.path.basename(key_or_path)
        here = os.path.abspath(os.path.dirname(key_or_path)) == os.path.abspath(self._dir)
        if here and RECORD_NAME.fullmatch(name):
            return os.path.join(self._dir, name), Stripes.of_name(name)
        return self.stripes.of(key_or_path)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, however many calls it takes."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_all(fd: int, size: int = 65536) -> bytes:
    """Read ``fd`` to its end."""
    # A regular file returns less than asked only at its end: one read() for a record.
    chunk = os.read(fd, size)
    if len(chunk) < size:
        return chunk
    chunks = [chunk]
    while chunk:
        chunk = os.read(fd, size)
        chunks.append(chunk)
    return b"".join(chunks)
