"""The worker of ``test_redis_reconnect.py``: Camp's Celery app (its settings, late acks,
prefetch 1, and camp/kombu_redis_close.py) with a beat of its own instead of Camp's ticks,
so no database is needed. ``tick`` runs every half second and, like Camp's
``request_cycle(countdown=...)``, sends a follow-up with a countdown: the worker always
holds unacknowledged messages, as a busy scheduler does. ``follow`` counts itself in the
broker's Redis, so the test sees the worker consume again after a reconnect."""

from __future__ import annotations

import os
import time

import redis

from camp.celery import app

app.conf.beat_schedule = {"reconnect-tick": {"task": "reconnect.tick", "schedule": 0.5}}


@app.task(name="reconnect.tick")
def tick() -> None:
    time.sleep(0.3)
    follow.apply_async(countdown=1)


@app.task(name="reconnect.follow")
def follow() -> None:
    time.sleep(0.2)
    redis.Redis.from_url(os.environ["CELERY_BROKER_URL"]).incr("reconnect:follow-done")
