"""The Celery application. Tasks are thin entry points (DESIGN.md §5)."""

import os

from celery import Celery, signals

from . import (
    kombu_filesystem_put,  # noqa: F401  the demo broker never hands out half a message
    kombu_redis_close,  # noqa: F401  a Redis reconnect must not end the worker
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")

app = Celery("camp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _observe_tasks() -> None:
    from . import logs, taskmetrics

    logs.connect_celery_signals()
    taskmetrics.connect_celery_signals()


_observe_tasks()


@signals.worker_init.connect
@signals.worker_process_init.connect
def _freeze_the_loaded_worker(**_: object) -> None:
    # worker_init: the worker has imported its tasks and its pool has not forked yet, so the
    # heap stays out of every full collection and shared with the prefork children rather
    # than copied into each; worker_process_init: what the fork added, in each child (camp.heap).
    from .heap import freeze_startup_heap

    freeze_startup_heap()
