"""Prometheus metrics of a store, read at scrape time: ``uniqjob[metrics]`` (prometheus_client).

An application that already runs ``prometheus_client`` registers the collector::

    from prometheus_client import REGISTRY
    from uniqjob.metrics import UniqjobCollector
    REGISTRY.register(UniqjobCollector())      # the configured store; or UniqjobCollector(backend)

and :func:`render` returns the text exposition format on its own (the
dashboard serves it at ``/metrics``). Every figure is over the whole store,
every key and every process, read with :func:`uniqjob.ops.stats` (so the
same as ``uniqjob stats`` shows):

- ``uniqjob_concurrency_parked_jobs``, ``uniqjob_concurrency_oldest_parked_age_seconds``,
  ``uniqjob_concurrency_slots_held{lease="fresh|stale"}``, ``uniqjob_concurrency_keys_at_limit``;
- ``uniqjob_locks{state="queued|running"}``, ``uniqjob_locks_orphaned``;
- ``uniqjob_locks_pending_calls``: queue locks with a pending call ("keep_last" behind a running
  call), ``uniqjob_debounced_jobs``: debounced jobs waiting for their due time;
- ``uniqjob_duplicates_total{job}``: duplicates dropped, rescheduled or raised over the last
  hour, as the store counts them (a sliding window: it falls as old minutes leave it);
  ``uniqjob_coalesced_total{job}`` and ``uniqjob_replaced_total{job}``: the calls coalesced
  ("keep_last", debounce) and replaced ("replace") over the same hour.
"""

from __future__ import annotations

from collections.abc import Iterator

try:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # the optional extra
    raise ImportError("uniqjob.metrics needs prometheus_client: pip install 'uniqjob[metrics]'") from exc

from . import config
from .ops import stats
from .stores.base import Backend

__all__ = ["UniqjobCollector", "render"]


class UniqjobCollector(Collector):
    """A collector that reads ``store`` (None: the configured default store) at each scrape."""

    def __init__(self, store: Backend | None = None) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        figures = stats(self.store if self.store is not None else config.default_backend())
        totals = figures.concurrency
        yield _gauge("concurrency_parked_jobs", "Jobs parked behind full concurrency keys", totals.parked)
        yield _gauge(
            "concurrency_oldest_parked_age_seconds",
            "Seconds the oldest parked job has waited (0: none parked)",
            totals.oldest_wait or 0.0,
        )
        yield _labelled(
            "concurrency_slots_held",
            "Concurrency slots held, by lease: fresh, or stale (lapsed, or its holder dead)",
            "lease",
            {"fresh": totals.slots_held - totals.stale_slots, "stale": totals.stale_slots},
        )
        yield _gauge(
            "concurrency_keys_at_limit", "Concurrency keys holding their limit", totals.keys_at_limit
        )
        locks = {"queued": figures.queued, "running": figures.running}
        yield _labelled("locks", "Held unique locks, by state", "state", locks)
        yield _gauge("locks_orphaned", "Held unique locks whose holder is dead", figures.orphaned)
        yield _gauge(
            "locks_pending_calls",
            "Queue locks with a pending call (keep_last, behind a running call)",
            figures.pending,
        )
        yield _gauge("debounced_jobs", "Debounced jobs waiting for their due time", figures.debouncing)
        for name, what, counts in (
            ("duplicates", "Duplicates dropped, rescheduled or raised", figures.duplicates),
            ("coalesced", "Calls coalesced into a queued or pending call (keep_last)", figures.coalesced),
            ("replaced", "Calls that replaced a queued call (replace)", figures.replaced),
        ):
            yield _labelled(f"{name}_total", f"{what} over the last hour, per job class", "job", counts)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"uniqjob_{name}", documentation, value=value)


def _labelled(name: str, documentation: str, label: str, values: dict[str, int]) -> GaugeMetricFamily:
    """The gauge ``uniqjob_NAME``, one value per value of its ``label``."""
    gauge = GaugeMetricFamily(f"uniqjob_{name}", documentation, labels=[label])
    for value, count in values.items():
        gauge.add_metric([value], count)
    return gauge


def render(store: Backend | None = None) -> bytes:
    """Return the metrics of ``store`` (None: the configured default) in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(UniqjobCollector(store))
    return generate_latest(registry)
