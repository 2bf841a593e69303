"""Celery task metrics for /metrics: what every worker ran, how it ended, how long it took,
and how many tasks wait in the queue.

Tasks run in many worker processes (prefork children across pods), so each process adds to
counters in Redis (the broker Camp already has) at the end of each task — one pipelined
round trip — and the web's /metrics reads them at scrape time (``CeleryCollector``), the
same collector pattern as portal/metrics.py. Without REDIS_URL (the demo) nothing is kept.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger("camp.taskmetrics")
_client: Any = None
_started: dict[str, float] = {}


def _redis() -> Any:
    global _client
    from django.conf import settings

    if not settings.REDIS_URL:
        return None
    if _client is None:
        import redis

        _client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=2, socket_timeout=2)
    return _client


def _key(name: str) -> str:
    from django.conf import settings

    prefix = settings.CACHES["default"].get("KEY_PREFIX", "camp")
    return f"{prefix}:celery:{name}"


def connect_celery_signals() -> None:
    from celery.signals import task_postrun, task_prerun

    @task_prerun.connect(weak=False)
    def _start(task_id: str = "", **_: Any) -> None:
        _started[task_id] = time.monotonic()

    @task_postrun.connect(weak=False)
    def _end(task_id: str = "", task: Any = None, state: str | None = None, **_: Any) -> None:
        started = _started.pop(task_id, None)
        name = getattr(task, "name", "unknown")
        try:
            client = _redis()
            if client is None:
                return
            pipe = client.pipeline(transaction=False)
            pipe.hincrby(_key("tasks"), f"{name}\t{state or 'UNKNOWN'}", 1)
            if started is not None:
                pipe.hincrbyfloat(_key("runtime"), name, time.monotonic() - started)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - metrics must never fail a task
            logger.debug("task metrics not recorded: %s", type(exc).__name__)


class CeleryCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        from django.conf import settings

        tasks = CounterMetricFamily("camp_celery_tasks", "Celery tasks finished, by task and state",
                                    labels=["task", "state"])
        runtime = CounterMetricFamily("camp_celery_task_runtime_seconds",
                                      "Seconds Celery workers spent running each task", labels=["task"])
        queue = GaugeMetricFamily("camp_celery_queue_length", "Tasks waiting in the Celery queue",
                                  labels=["queue"])
        client = _redis()
        if client is not None:
            try:
                for field, count in client.hgetall(_key("tasks")).items():
                    name, _, state = field.decode().partition("\t")
                    tasks.add_metric([name, state], float(count))
                for field, seconds in client.hgetall(_key("runtime")).items():
                    runtime.add_metric([field.decode()], float(seconds))
                if str(settings.CELERY_BROKER_URL).startswith(("redis://", "rediss://")):
                    for name in settings.CELERY_TASK_QUEUES:  # the scheduler's queue and the rest
                        queue.add_metric([name], float(client.llen(name)))
            except Exception as exc:  # noqa: BLE001 - Redis away: the other metrics still answer
                logger.warning("celery metrics unavailable: %s", type(exc).__name__)
        yield from (tasks, runtime, queue)
