"""Receivers of scheduler signals: record cycle and dispatch statistics."""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_save
from django.dispatch import receiver

from scheduling import signals
from scheduling.models import Job, SchedulingDecision
from workspaces.models import ModelService

from .live import job_changed, jobs_changed, service_changed
from .models import CycleStat, DispatchError


@receiver(post_save, sender=Job)
def _job_saved(sender: Any, instance: Job, **kwargs: Any) -> None:
    job_changed(instance.pk)


@receiver(post_save, sender=ModelService)
def _service_saved(sender: Any, instance: ModelService, **kwargs: Any) -> None:
    # the autoscaler's and a person's scaling save the row; the status it derives from its
    # replicas is written with update() and pushed by the serving service itself
    service_changed(instance.pk)


@receiver(post_save, sender=SchedulingDecision)
def _decision_recorded(sender: Any, instance: SchedulingDecision, created: bool, **kwargs: Any) -> None:
    # Every state transition records a decision, including those made with
    # queryset.update() (which sends no post_save for the Job itself).
    if created:
        job_changed(instance.job_id)


@receiver(signals.decisions_recorded)
def _decisions_recorded_in_bulk(sender: Any, job_ids: list[int], **kwargs: Any) -> None:
    jobs_changed(job_ids)


@receiver(signals.cycle_finished)
def _cycle_finished(sender: Any, cluster_id: int, seconds: float, **counts: int) -> None:
    CycleStat.objects.create(
        cluster_id=cluster_id, seconds=seconds,
        **{k: counts.get(k, 0) for k in ("admitted", "waiting", "rejected", "preempting")},
    )


@receiver(signals.dispatch_failed)
def _dispatch_failed(sender: Any, cluster_id: int, job_id: int, message: str, **_: Any) -> None:
    DispatchError.objects.create(cluster_id=cluster_id, job_id=job_id, message=message[:500])
