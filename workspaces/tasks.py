"""Celery entry points for workloads: thin, take ids, idempotent (DESIGN.md §5)."""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import OperationalError
from django.db.models import F, Q

from scheduling import services as scheduling
from scheduling.backends import backend_for
from scheduling.backends.base import BackendError
from scheduling.models import FINAL_STATES, Cluster

from . import services
from .models import TrainingJob

logger = logging.getLogger(__name__)
_OPTS = {"acks_late": True, "reject_on_worker_lost": True}


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def workspaces_tick() -> dict[str, int]:
    """Beat: idle culling, retiring the links and cookies of environments whose run ended,
    then every unfinished training job (dependencies, checkpoints, restarts and lost GPU
    time, maximum runtime, retries)."""
    culled = services.environments_cull()
    services.environments_retire_access()
    unfinished = TrainingJob.objects.filter(
        Q(job__isnull=True, failed_dependency=False, stop_reason="")
        | (Q(job__isnull=False) & ~Q(job__state__in=FINAL_STATES))
        | Q(job__state="failed", retries__lt=F("retry_limit"), stop_reason=""))
    synced = 0
    for pk in unfinished.values_list("pk", flat=True):
        training_sync.delay(pk)
        synced += 1
    return {"warned": len(culled["warned"]), "culled": len(culled["culled"]), "trainings": synced}


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def training_sync(training_id: int) -> str:
    t = TrainingJob.objects.filter(pk=training_id).first()
    if t is None:
        return "gone"
    return services.training_sync(training=t)


@shared_task(**_OPTS, autoretry_for=(BackendError,), retry_backoff=2, max_retries=5)
def delete_objects(cluster_id: int, namespace: str, objects: list[list[str] | tuple[str, str]]) -> int:
    """Remove what a deleted environment left in the cluster (its home volume included)."""
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return 0
    backend = backend_for(cluster)
    n = 0
    for kind, name in objects:
        backend.delete_object(namespace, kind, name)  # 404 counts as done; errors retry
        n += 1
    return n


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def services_autoscale() -> dict[str, int]:
    """Beat (``SERVING_AUTOSCALE_SECONDS``): one autoscaler step per model service
    (workspaces/services/serving.py): load → desired replicas → replica jobs added or removed.
    One step at a time: a step slowed by a Prometheus that does not answer (each read waits
    for its timeout) makes the next beats skip, never run beside it on every worker."""
    if not scheduling.periodic_request("services-autoscale", 0):
        return {"skipped": 1}
    try:
        return services.model_services_autoscale()
    finally:
        scheduling.periodic_request_taken("services-autoscale", 0)


@shared_task(**_OPTS)
def services_sweep() -> int:
    """Beat (``SERVING_SWEEP_SECONDS``): queue one sweep per enabled Kubernetes cluster that may
    be called now (not backing off, none of its sweeps queued or running), so a cluster that
    does not answer delays no other's."""
    n = 0
    for cluster in Cluster.objects.filter(enabled=True, backend="kubernetes").only("pk", "retry_at"):
        if scheduling.cluster_due(cluster) and scheduling.periodic_request("services-sweep", cluster.pk):
            cluster_services_sweep.delay(cluster.pk)
            n += 1
    return n


@shared_task(**_OPTS, autoretry_for=(OperationalError,), retry_backoff=1, max_retries=5)
def cluster_services_sweep(cluster_id: int) -> dict[str, int] | str:
    """Delete the Service and Ingress objects of deleted model services on one cluster (one
    list each), through the gate of periodic cluster calls (``cluster_periodic``: probe, time
    budget, backoff); an unreachable cluster waits for a later round."""
    return scheduling.cluster_periodic("services-sweep", cluster_id, lambda cluster: {
        "removed": len(services.model_service_objects_sweep(cluster=cluster))})
