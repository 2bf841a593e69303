"""The audit log: append-only, hash-chained, written in the caller's transaction.

Each row's ``hash`` is SHA-256 over its canonical content and the previous row's
hash, so editing or deleting any row (even as a database superuser with the
append-only triggers disabled) breaks the chain at that row; ``manage.py
audit_verify`` finds it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import json
import secrets
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import connection, models, transaction
from django.utils import timezone

from .middleware import current_request
from .models import AuditEvent, Project, Tenant, User

GENESIS_HASH = "0" * 64
# Any fixed 64-bit number: the advisory lock that serialises appends to the chain.
_CHAIN_LOCK_KEY = 0x43414D50415544  # "CAMPAUD"


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so that what is hashed is exactly what is stored."""
    if value is None:
        return None
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def _canonical(value: Any) -> Any:
    """Numbers as the database gives them back: jsonb turns 1e16 or 2.0 into integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _normalize_ip(ip: str | None) -> str | None:
    """The form PostgreSQL's inet stores (IPv6 compressed and lower-case)."""
    if not ip:
        return None
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        return None


def _payload(fields: dict[str, Any], prev_hash: str) -> str:
    return json.dumps(
        _canonical({**fields, "prev_hash": prev_hash}), sort_keys=True, separators=(",", ":"),
        default=str,
    )


def compute_hash(fields: dict[str, Any], prev_hash: str) -> str:
    return hashlib.sha256(_payload(fields, prev_hash).encode()).hexdigest()


class _Prepared:
    """An event's hashed payload serialised before the chain lock is taken, with a random
    stand-in where the previous hash goes: under the lock only the stand-in is replaced and
    the SHA-256 taken, so the lock is not held while JSON is built (the bytes hashed, and so
    the hash, are exactly ``compute_hash``'s)."""

    __slots__ = ("head", "tail")

    def __init__(self, fields: dict[str, Any]) -> None:
        stand_in = secrets.token_hex(32)  # 256 random bits: appears nowhere else in the text
        self.head, _, self.tail = _payload(fields, stand_in).partition(stand_in)

    def hash(self, prev_hash: str) -> str:
        return hashlib.sha256(f"{self.head}{prev_hash}{self.tail}".encode()).hexdigest()


def _hashed_fields(event: AuditEvent) -> dict[str, Any]:
    return {
        "created_at": event.created_at.isoformat(),
        "actor_id": event.actor_id,
        "actor_username": event.actor_username,
        "tenant_id": event.tenant_id,
        "project_id": event.project_id,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "target_repr": event.target_repr,
        "before": event.before,
        "after": event.after,
        "request_id": event.request_id,
        "client_ip": event.client_ip,
    }


def snapshot(obj: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    """The before/after picture of a model instance: the named fields, JSON-safe."""
    data: dict[str, Any] = {}
    for name in fields:
        value = getattr(obj, name)
        if isinstance(value, models.Model):
            value = value.pk
        data[name] = value
    return _jsonable(data)


def audit_record(
    *,
    actor: User | None,
    action: str,
    target: models.Model | None = None,
    tenant: Tenant | None = None,
    project: Project | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    actor_username: str | None = None,
    target_repr: str | None = None,
) -> AuditEvent:
    """Append one event to the chain, inside the caller's transaction.

    Inside ``audit_batch()`` the event is buffered and appended when the batch ends."""
    ctx = current_request.get()
    event = AuditEvent(
        created_at=timezone.now(),
        actor=actor if actor is not None and actor.pk else None,
        actor_username=actor_username
        if actor_username is not None
        else (actor.get_username() if actor is not None else ""),
        tenant=tenant,
        project=project,
        action=action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None and target.pk is not None else "",
        target_repr=(target_repr if target_repr is not None else str(target or ""))[:255],
        before=_jsonable(before),
        after=_jsonable(after),
        request_id=ctx.request_id,
        client_ip=_normalize_ip(ctx.client_ip),
    )
    batch = _batch.get()
    if batch is not None:
        batch.append(event)
        return event
    with transaction.atomic():
        _append([event])
    return event


# Events buffered by audit_batch(), appended when it ends.
_batch: ContextVar[list[AuditEvent] | None] = ContextVar("camp_audit_batch", default=None)


def _append(events: list[AuditEvent]) -> None:
    """Chain and insert ``events`` in order, under the chain lock (held until commit)."""
    if not events:
        return
    prepared = [_Prepared(_hashed_fields(event)) for event in events]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK_KEY])
    prev_hash = AuditEvent.objects.order_by("-id").values_list("hash", flat=True).first() or GENESIS_HASH
    for event, payload in zip(events, prepared, strict=True):
        event.prev_hash = prev_hash
        event.hash = payload.hash(prev_hash)
        prev_hash = event.hash
    # bulk_create inserts in list order, so ids follow the chain.
    AuditEvent.objects.bulk_create(events)


@contextlib.contextmanager
def audit_batch() -> Iterator[None]:
    """Buffer the audit events of a long transaction and append them at its end.

    The chain lock is taken only as the transaction's last step, so it is never held while
    the transaction waits for a row lock: no deadlock with a short transaction that locks
    such a row and then audits, and other writers wait only for our commit. Record events
    after (not inside) any savepoint that may roll back: a buffered event is kept."""
    if _batch.get() is not None:  # nested: the outer batch appends
        yield
        return
    buffer: list[AuditEvent] = []
    token = _batch.set(buffer)
    try:
        yield
    finally:
        _batch.reset(token)
    _append(buffer)


@dataclass(frozen=True)
class ChainBreak:
    event_id: int
    problem: str


def verify_chain(events: Iterable[AuditEvent] | None = None) -> Iterator[ChainBreak]:
    """Yield every row whose content or link no longer matches the chain."""
    rows = events if events is not None else AuditEvent.objects.order_by("id").iterator()
    prev = GENESIS_HASH
    for event in rows:
        # Reload timestamps as aware datetimes in UTC, as they were when hashed.
        event.created_at = event.created_at.astimezone(dt.UTC)
        if event.prev_hash != prev:
            yield ChainBreak(event.pk, "its link to the previous row is broken "
                             "(a row before it was removed or rewritten)")
        elif compute_hash(_hashed_fields(event), event.prev_hash) != event.hash:
            yield ChainBreak(event.pk, "its content does not match its hash (the row was edited)")
        prev = event.hash
