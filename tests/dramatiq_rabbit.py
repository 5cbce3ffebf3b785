"""Unique Dramatiq actors on RabbitMQ (``UNIQJOB_TEST_AMQP_URL``), for tests/test_dramatiq_workers.py.

Their bodies are tests/dramatiq_app.py's; the locks are in the test Redis. The
queue is ``UNIQJOB_TEST_DRAMATIQ_QUEUE``, deleted by :func:`delete_queues`.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.common import dq_name, xq_name

from tests.dramatiq_app import QUEUE, fail_at_first, gated
from uniqjob.integrations.dramatiq import UniqueMiddleware

broker = RabbitmqBroker(url=os.environ["UNIQJOB_TEST_AMQP_URL"])
broker.add_middleware(UniqueMiddleware())
dramatiq.set_broker(broker)  # (tests.dramatiq_app set its Redis one): the worker's


@dramatiq.actor(
    queue_name=QUEUE, unique=True, unique_lock_autoexpire=600, unique_run_lease=2.0, max_retries=0
)
def gate(name: str) -> None:
    gated(name)


@dramatiq.actor(
    queue_name=QUEUE, unique=True, unique_lock_autoexpire=600, max_retries=2, min_backoff=200, max_backoff=400
)
def flaky(name: str, failures: int) -> None:
    fail_at_first(name, failures)


def delete_queues() -> None:
    """Delete the test's queues from RabbitMQ (they are durable)."""
    for name in (QUEUE, dq_name(QUEUE), xq_name(QUEUE)):
        broker.channel.queue_delete(name)
