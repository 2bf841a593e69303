"""Celery entry points: thin, take ids, idempotent (DESIGN.md §5).

Every task is acked late and rejected (so redelivered) when its worker dies
(CELERY_TASK_ACKS_LATE + task_reject_on_worker_lost): a cycle killed mid-way rolls
back its transaction, loses its advisory lock with its connection, and runs again.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from . import services
from .backends.base import BackendError
from .models import Cluster, Job
from .services import placement as multicluster

logger = logging.getLogger(__name__)

_OPTS = {"acks_late": True, "reject_on_worker_lost": True}


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def cluster_cycle(cluster_id: int) -> dict[str, int] | str:
    """One scheduling cycle of one cluster (another worker's cycle → try again shortly)."""
    services.cycle_request_taken(cluster_id)
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return "gone"
    # A disabled or unreachable cluster's cycle admits nothing; it sends its queued floating
    # jobs back to the global queue and says why its pinned ones wait (``closed_hold``).
    summary = services.cycle_run(cluster=cluster)
    if summary is None:
        services.request_cycle(cluster_id, countdown=1)
        return "busy"
    if summary.closed:
        return "disabled" if summary.closed.endswith("disabled") else "unreachable"
    if summary.admitted:
        # Jobs behind the heads that were tried may fit now: go again until nothing is admitted.
        services.request_cycle(cluster_id)
    if Job.objects.filter(cluster__isnull=True, floating=True, state="queued").exists():
        multicluster.request_placement(countdown=1)  # room may have changed for the global queue
    return {"admitted": len(summary.admitted), "waiting": len(summary.waiting),
            "preempting": len(summary.preempting), "rejected": len(summary.rejected)}


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def placement_step() -> dict[str, int] | str:
    """One placement step of the global queue (floating jobs → clusters)."""
    multicluster.placement_request_taken()
    summary = multicluster.placement_run()
    if summary is None:
        multicluster.request_placement(countdown=1)
        return "busy"
    return {"placed": len(summary.placed), "moved": len(summary.moved),
            "waiting": len(summary.waiting), "rejected": len(summary.rejected)}


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def cluster_reconcile(cluster_id: int) -> dict[str, int] | str:
    """One reconcile through the gate of periodic cluster calls (``cluster_periodic``: a quick
    probe, one attempt per call, a time budget), so a dead API server holds a worker for
    seconds, once per backoff step, never for a retry ladder on every tick; the outcome drives
    the cluster's backoff (``cluster_reachability_record``)."""

    def run(cluster: Cluster) -> dict[str, int]:
        result = services.cluster_reconcile(cluster=cluster)
        return {"started": len(result.started), "finished": len(result.finished),
                "released": len(result.released), "orphans": len(result.orphans_deleted)}

    return services.cluster_periodic("reconcile", cluster_id, run)


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=2, max_retries=3)
def cluster_inventory_sync(cluster_id: int) -> dict[str, int] | str:
    """One inventory sync through the gate of periodic cluster calls (as ``cluster_reconcile``)."""

    def run(cluster: Cluster) -> dict[str, int] | str:
        try:
            result = services.inventory_sync(cluster=cluster)
        except ValueError as exc:  # an inventory that cannot be read (a simulated cluster's YAML)
            Cluster.objects.filter(pk=cluster_id).update(last_error=str(exc)[:500])
            return "error"
        return {"nodes": result.nodes, "gpus": result.gpus, "evicted": len(result.evicted_jobs)}

    return services.cluster_periodic("inventory", cluster_id, run)


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=2, max_retries=3)
def cluster_utilization_sync(cluster_id: int) -> dict[str, int] | str:
    """Per-GPU utilisation and used memory from the cluster's Prometheus (if configured).
    Not the API server: a Prometheus that does not answer closes nothing (its error is kept)."""
    try:
        cluster = Cluster.objects.filter(pk=cluster_id, enabled=True).exclude(prometheus_url="").first()
        if cluster is None:
            return "off"
        try:
            result = services.utilization_sync(cluster=cluster)
        except BackendError as exc:
            Cluster.objects.filter(pk=cluster_id).update(last_error=str(exc)[:500])
            return "error"
        return {"matched": result.matched, "cleared": result.cleared, "unmatched": result.unmatched}
    finally:
        services.periodic_request_taken("utilization", cluster_id)


@shared_task(**_OPTS)
def utilization_tick() -> int:
    """Beat: read the utilisation feed of every enabled cluster that has one."""
    n = 0
    for cluster_id in Cluster.objects.filter(enabled=True).exclude(prometheus_url="").values_list(
            "pk", flat=True):
        # One read per cluster queued or running at a time: a Prometheus that does not answer
        # holds one worker for its timeout, never a pile of reads (``periodic_request``).
        if services.periodic_request("utilization", cluster_id):
            cluster_utilization_sync.delay(cluster_id)
            n += 1
    return n


@shared_task(bind=True, **_OPTS, max_retries=5)
def job_dispatch(self, job_id: int) -> str:  # type: ignore[no-untyped-def]
    """Create an admitted job's pods; retryable cluster errors back off exponentially."""
    if not Job.objects.filter(pk=job_id).exists():
        return "gone"
    final = self.request.retries >= self.max_retries
    try:
        outcome = services.job_dispatch(job_id=job_id, final_attempt=final)
    except BackendError as exc:
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries, 30)) from exc
    if outcome == "pending":
        # The device plugin has not answered yet: a fresh task resumes the wait shortly (not
        # a retry: waiting is not failing), leaving this worker free meanwhile.
        job_dispatch.apply_async((job_id,), countdown=1)
    return outcome


@shared_task(**_OPTS)
def jobs_dispatch(job_ids: list[int]) -> int:
    """Queue ``job_dispatch`` for each job a cycle admitted: the cycle queues this one task
    instead of one per job, and the dispatches still run in parallel on every worker."""
    for job_id in job_ids:
        job_dispatch.delay(job_id)
    return len(job_ids)


@shared_task(**_OPTS)
def jobs_stop(job_ids: list[int]) -> int:
    """Queue ``job_stop`` for each job a cycle preempted (one task from the cycle, as
    ``jobs_dispatch``; the stops still run in parallel on every worker)."""
    for job_id in job_ids:
        job_stop.delay(job_id)
    return len(job_ids)


@shared_task(**_OPTS, autoretry_for=(OperationalError, BackendError), retry_backoff=1, max_retries=5)
def job_stop(job_id: int, attempt: int | None = None) -> str:
    """Stop the job's pods of ``attempt`` (None: its current one), only while it is stopping:
    a stop delivered late never touches a later attempt (``services.job_stop``)."""
    if not Job.objects.filter(pk=job_id).exists():
        return "gone"
    return services.job_stop(job_id=job_id, attempt=attempt, queued=True)


def _beat_sent_at(expires: Any, entry: str) -> float | None:
    """When the beat sent a tick: its absolute expiry (Celery's ``expires`` header) less the
    entry's relative one (``CELERY_BEAT_SCHEDULE[entry]["options"]["expires"]``); None when
    either is unknown (a tick queued by hand, an eager run)."""
    beat: dict[str, Any] = settings.CELERY_BEAT_SCHEDULE.get(entry, {})
    relative = (beat.get("options") or {}).get("expires")
    if not expires or relative is None:
        return None
    at = expires if isinstance(expires, dt.datetime) else dt.datetime.fromisoformat(str(expires))
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return at.timestamp() - float(relative)


@shared_task(bind=True, **_OPTS)
def scheduler_tick(self: Any) -> int:
    """Beat: reconcile and schedule every enabled cluster (and record how long the tick
    waited in the queue: the admin home's "scheduler lagging", ``services.scheduler_lag``)."""
    services.scheduler_tick_ran(sent_at=_beat_sent_at(self.request.expires, "scheduler-tick"))
    n = 0
    for cluster in Cluster.objects.filter(enabled=True).only("pk", "retry_at"):
        # A cluster backing off is skipped until its retry time; a reconcile still queued
        # or running is not queued again (ticks coalesce per cluster).
        if services.cluster_due(cluster) and services.periodic_request("reconcile", cluster.pk):
            cluster_reconcile.delay(cluster.pk)
        services.request_cycle(cluster.pk)
        n += 1
    if Job.objects.filter(floating=True, state="queued").exists():
        multicluster.request_placement()
    return n


@shared_task(**_OPTS)
def inventory_tick() -> int:
    """Beat: full inventory list of every enabled cluster (one task per cluster: a slow one
    never delays another's; not while it backs off, nor while its last sync is queued or
    running)."""
    n = 0
    for cluster in Cluster.objects.filter(enabled=True).only("pk", "retry_at"):
        if services.cluster_due(cluster) and services.periodic_request("inventory", cluster.pk):
            cluster_inventory_sync.delay(cluster.pk)
            n += 1
    return n
