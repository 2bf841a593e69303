"""The Celery application. Tasks are thin entry points (DESIGN.md §5)."""

import os

from celery import Celery

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
