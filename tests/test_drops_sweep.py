"""The Python stores' dropped-duplicate buckets: swept at the first count of a bucket."""

from __future__ import annotations

from uniqjob.locks import QueueMeta
from uniqjob.stores import _drops
from uniqjob.stores.memory import MemoryBackend

T0 = 1_800_000_000.0  # a store time on a bucket boundary (divisible by 60)


def test_a_new_bucket_sweeps_every_class_past_keeping() -> None:
    counts: _drops.Counts = {}
    _drops.add(counts, "a.Old", T0)
    _drops.add(counts, "a.Kept", T0 + 120)
    later = T0 + _drops.KEEP + 60  # a.Old's bucket is now past keeping, a.Kept's is not
    _drops.add(counts, "a.New", later)
    assert counts == {
        "a.Kept": {str(_drops.minute(T0 + 120)): 1},
        "a.New": {str(_drops.minute(later)): 1},
    }


def test_counts_in_one_bucket_add_up_and_a_take_back_empties_it() -> None:
    counts: _drops.Counts = {}
    for _ in range(3):
        _drops.add(counts, "a.Job", T0 + 5)
    assert counts == {"a.Job": {str(_drops.minute(T0)): 3}}
    for _ in range(4):  # never below 0; an empty bucket, and then its class, go
        _drops.add(counts, "a.Job", T0 + 30, -1)
    assert counts == {}


def test_memory_store_drops_old_counts_as_the_clock_moves() -> None:
    now = [T0]
    backend = MemoryBackend(clock=lambda: now[0])
    meta = QueueMeta("a.Job", "1")
    assert backend.claim("k", "holder", meta=meta) is None
    assert backend.claim("k", "other", meta=meta, count=True) is not None
    assert backend.duplicates(window=60) == {"a.Job": 1}
    now[0] = T0 + _drops.KEEP + 60
    assert backend.claim("k2", "holder", meta=meta) is None
    assert backend.claim("k2", "other", meta=meta, count=True) is not None
    assert backend._drops == {"a.Job": {str(_drops.minute(now[0])): 1}}
    assert backend.duplicates(window=_drops.WINDOW) == {"a.Job": 1}
