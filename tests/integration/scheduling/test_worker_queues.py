"""The scheduler's own steps are not kept behind other work (issue 35, target 4): a burst of
admissions queues one dispatch per job, and in one FIFO queue the beat's ticks waited behind all
of them and expired unrun (bench/scale_out.py: 39,786 messages queued, nothing admitted for ten
minutes). The tick, a cluster's cycle and the placement step have a queue of their own, which
every worker consumes beside the other (camp/settings/tasks.py), served in turn."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.core.cache import cache

from scheduling import tasks
from scheduling.services.clusters import SCHEDULER_TICK_KEY

from .test_concurrency import celery_worker

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 5000


def test_the_scheduler_steps_have_their_own_queue_which_every_worker_consumes() -> None:
    from camp.celery import app

    for name in settings.SCHEDULING_TASKS:
        assert app.amqp.router.route({}, name)["queue"].name == settings.SCHEDULING_QUEUE
    assert app.amqp.router.route({}, "scheduling.tasks.job_dispatch")["queue"].name == \
        settings.CELERY_TASK_DEFAULT_QUEUE
    # a worker started without -Q (the chart's, compose's, the demo's) consumes every queue
    assert set(app.amqp.queues) == {settings.SCHEDULING_QUEUE, settings.CELERY_TASK_DEFAULT_QUEUE}


def test_a_tick_runs_while_a_backlog_of_dispatches_is_still_queued(world: object) -> None:
    import redis

    from camp.celery import app

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    with celery_worker():
        try:
            # dispatches of jobs that no longer exist: each answers "gone" after one query
            with app.producer_or_acquire() as producer:
                for i in range(BACKLOG):
                    tasks.job_dispatch.apply_async((10**9 + i,), producer=producer)
            cache.delete(SCHEDULER_TICK_KEY)
            tasks.scheduler_tick.apply_async()
            deadline = time.monotonic() + 300
            while cache.get(SCHEDULER_TICK_KEY) is None:
                assert time.monotonic() < deadline, "the tick never ran"
                time.sleep(0.05)
            left = client.llen(settings.CELERY_TASK_DEFAULT_QUEUE)
            # in one FIFO queue the tick would run after the whole backlog (0 left)
            assert left > 0, "the tick waited for every dispatch queued before it"
        finally:
            app.control.purge()
