"""Celery entry points of the tenants app."""

from __future__ import annotations

from celery import shared_task

from tenants.audit import seal


@shared_task(acks_late=True, ignore_result=True)
def audit_anchor() -> int | None:
    """Seal, then append the chain's head to the anchor outside the database
    (tenants/anchor.py); the beat runs it every ``AUDIT_ANCHOR_SECONDS``."""
    from tenants.anchor import anchor_write

    seal(wait=True)
    head = anchor_write()
    return head.seq if head is not None else None


@shared_task(acks_late=True, ignore_result=True)
def audit_seal() -> int:
    """Seal what large writers asked to have sealed (``audit.request_seal``) and what a
    writer's own seal-after-commit could not take (it found another sealer holding the lock,
    which may have read the unsealed rows before its commit, and asked for this task); the
    beat runs it every ``AUDIT_SEAL_SECONDS``, for requests a broker that was down lost.
    Waits for the chain lock: one sealer at a time."""
    from django.core.cache import cache

    from tenants.audit import SEAL_QUEUED_KEY

    cache.delete(SEAL_QUEUED_KEY)  # requests from now on queue another run
    return seal(wait=True)


@shared_task(acks_late=True, ignore_result=True)
def ldap_sync() -> dict[str, object]:
    """Re-read every directory account (tenants/sso/ldap_sync.py): roles whose groups are
    gone are revoked, removed or locked accounts deactivated; the beat runs it every
    ``LDAP_SYNC_SECONDS`` (nothing to do unless LDAP_ENABLED)."""
    from django.conf import settings

    if not settings.LDAP_ENABLED:
        return {"error": "LDAP sign-in is not enabled"}
    from tenants.sso.ldap_sync import ldap_sync as run

    return run().as_dict()
