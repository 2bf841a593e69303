"""Writes for the portal: periodic usage samples (the system acts; nothing to audit)."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduling.models import Allocation, Cluster, JobState

from . import selectors
from .models import ClusterSample, CycleStat, DispatchError, UsageSample


@transaction.atomic
def usage_sample_record(*, cluster: Cluster, now: dt.datetime | None = None,
                        interval_seconds: int | None = None) -> ClusterSample:
    """Record the cluster's state and who holds what, for charts and showback."""
    now = now or timezone.now()
    interval = interval_seconds or settings.USAGE_SAMPLE_SECONDS
    state = selectors.cluster_now(cluster)
    sample = ClusterSample.objects.create(
        cluster=cluster, at=now, interval_seconds=interval,
        gpus_total=state.gpus_total, gpus_in_use=state.gpus_in_use,
        gpu_share_allocated=state.gpu_share_allocated,
        gpu_memory_total_mib=state.gpu_memory_total_mib,
        gpu_memory_allocated_mib=state.gpu_memory_allocated_mib,
        utilization_percent=state.utilization_percent,
        jobs_queued=state.jobs_by_state.get(JobState.QUEUED, 0),
        jobs_running=state.jobs_by_state.get(JobState.RUNNING, 0),
        wait_p50_seconds=selectors.percentile(state.wait_seconds, 50),
        wait_p95_seconds=selectors.percentile(state.wait_seconds, 95),
    )
    held = selectors.held_by(Allocation.objects.filter(cluster=cluster))
    UsageSample.objects.bulk_create([
        UsageSample(sample=sample, tenant_id=tenant_id, project_id=project_id, user_id=user_id,
                    gpu_share=h.gpus, gpu_memory_mib=h.gpu_memory_mib,
                    cpu_millicores=round(h.cpu_cores * 1000), ram_mib=h.ram_mib)
        for (tenant_id, project_id, user_id), h in held.items()
    ])
    return sample


def samples_prune(*, older_than: dt.timedelta) -> int:
    """Drop observations older than the retention period."""
    cutoff = timezone.now() - older_than
    deleted, _ = ClusterSample.objects.filter(at__lt=cutoff).delete()
    CycleStat.objects.filter(at__lt=cutoff).delete()
    DispatchError.objects.filter(at__lt=cutoff).delete()
    return deleted
