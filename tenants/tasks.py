"""Celery entry points of the tenants app."""

from __future__ import annotations

from celery import shared_task

from tenants.audit import seal


@shared_task(acks_late=True, ignore_result=True)
def audit_seal() -> int:
    """Seal the audit events a writer's own seal-after-commit missed (it lost the race to a
    sealer that had already read its rows). Waits for the chain lock: one sealer at a time."""
    return seal(wait=True)
