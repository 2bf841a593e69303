"""The Celery application. Tasks are thin entry points (DESIGN.md §5)."""

import os

from celery import Celery
from celery.signals import worker_init

from . import kombu_redis_close  # noqa: F401  a Redis reconnect must not end the worker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")

app = Celery("camp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def _preload_kubernetes_client(**_: object) -> None:
    """The Kubernetes client takes seconds of CPU to import (4 s on a loaded 2-core machine):
    imported once in the worker's main process, before its pool forks, rather than by the first
    task of each pool process that meets a Kubernetes cluster, which held that worker process
    (docs/BENCHMARKS.md §5)."""
    import kubernetes.client  # noqa: F401
