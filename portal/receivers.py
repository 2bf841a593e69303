"""Receivers of scheduler signals: record cycle and dispatch statistics."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from scheduling import signals

from .models import CycleStat, DispatchError


@receiver(signals.cycle_finished)
def _cycle_finished(sender: Any, cluster_id: int, seconds: float, **counts: int) -> None:
    CycleStat.objects.create(
        cluster_id=cluster_id, seconds=seconds,
        **{k: counts.get(k, 0) for k in ("admitted", "waiting", "rejected", "preempting")},
    )


@receiver(signals.dispatch_failed)
def _dispatch_failed(sender: Any, cluster_id: int, job_id: int, message: str, **_: Any) -> None:
    DispatchError.objects.create(cluster_id=cluster_id, job_id=job_id, message=message[:500])
