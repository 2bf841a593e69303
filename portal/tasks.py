"""Thin Celery entry points for the portal."""

import datetime as dt

from celery import shared_task
from django.conf import settings

from scheduling.models import Cluster

from . import services


@shared_task(ignore_result=True)
def usage_sample_all() -> int:
    """Sample every enabled cluster (beat, every USAGE_SAMPLE_SECONDS)."""
    count = 0
    for cluster in Cluster.objects.filter(enabled=True):
        services.usage_sample_record(cluster=cluster)
        count += 1
    services.samples_prune(older_than=dt.timedelta(days=settings.USAGE_RETENTION_DAYS))
    return count


@shared_task(ignore_result=True)
def live_push_jobs(job_ids: list[int]) -> int:
    """Push many jobs' new state to live pages (after a scheduling cycle or a bulk submit)."""
    from .live import push_jobs

    return push_jobs(job_ids)


@shared_task(ignore_result=True)
def demo_load_tick() -> dict[str, object]:
    """Beat (only with DEMO_LOAD on, as `rundemo` sets it): one step of the demo's load."""
    from . import demo

    return demo.tick()
