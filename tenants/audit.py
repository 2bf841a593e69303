"""The audit log: append-only, hash-chained, written in the caller's transaction.

Each row's ``hash`` is SHA-256 over its canonical content and the previous row's
hash, so editing or deleting any sealed row (even as a database superuser with the
append-only triggers disabled) breaks the chain at that row; ``manage.py
audit_verify`` finds it.

Writers do not wait for one another (issue 13): on PostgreSQL an event is inserted
*unsealed* (no ``prev_hash``/``hash``/``chain_seq``) in the caller's transaction, with no
lock, and ``seal()`` chains the committed unsealed rows, oldest id first, after the last
sealed one, in a short transaction under the chain's advisory lock (one sealer at a
time). A writer's transaction asks for a seal when it commits (``pg_try_advisory_xact_lock``:
if another process is sealing, it returns at once and queues the ``audit_seal`` task, which
takes its rows); the Celery beat task ``tenants.tasks.audit_seal`` sweeps up what a race
left (the broker was down);
``verify_chain()`` and ``manage.py audit_verify`` seal before they verify. The chain's
order is ``chain_seq`` (the order of sealing), not ``id``: a transaction that took its ids
early but committed late is chained after rows that committed before it; its own events
stay in their id order. The append-only trigger lets an UPDATE through only to seal an
unsealed row (its three chain columns, once; every other column unchanged).

What this trades: between commit and seal (milliseconds after a commit, the task's delay
after a lost race, at most one beat period if the broker is down) an event is not yet
covered by the chain. SQLite (the demo)
serialises writers itself, so there an event is sealed as it is inserted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import ipaddress
import json
import logging
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, overload

from django.db import connection, models, transaction
from django.utils import timezone

from .middleware import current_request
from .models import AuditEvent, Project, Tenant, User

logger = logging.getLogger(__name__)

GENESIS_HASH = "0" * 64
# Any fixed 64-bit number: the advisory lock that serialises sealing (one sealer at a time).
_CHAIN_LOCK_KEY = 0x43414D50415544  # "CAMPAUD"
# Rows one sealing transaction chains at most (a cycle's audit events fit in one).
SEAL_BATCH = 5000


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so that what is hashed is exactly what is stored."""
    if value is None:
        return None
    return json.loads(json.dumps(value, default=str, sort_keys=True))


# Keys whose mapping value is a workload's environment: often secrets (tokens, passwords).
ENV_KEYS = frozenset({"env"})


def env_names_only(value: Any) -> Any:
    """``value`` with every environment mapping (a key in ENV_KEYS holding a dict) replaced by
    the sorted list of its names, at any depth. The audit chain is append-only and readable by
    tenant owners (API, CSV): a value written there could never be purged."""
    if isinstance(value, dict):
        return {k: sorted(str(n) for n in v) if k in ENV_KEYS and isinstance(v, dict)
                else env_names_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [env_names_only(v) for v in value]
    return value


def _stored(value: Any) -> Any:
    """What an event keeps of ``before``/``after``: :func:`env_names_only` of it, round-tripped
    through JSON (:func:`_jsonable`). The walk runs only when the JSON text names a key of
    ``ENV_KEYS`` at all (a key is always quoted there): a scheduler's event carries a placement,
    thousands of them per cycle, and no environment."""
    if value is None:
        return None
    text = json.dumps(value, default=str, sort_keys=True)
    if any(f'"{key}"' in text for key in ENV_KEYS):
        text = json.dumps(env_names_only(value), default=str, sort_keys=True)
    return json.loads(text)


def without_values(text: str, values: Iterable[Any]) -> str:
    """``text`` (an error from a cluster, which may echo what it refused) with every
    environment value of at least 4 characters replaced by ``[redacted]``."""
    for value in sorted({str(v) for v in values if len(str(v)) >= 4}, key=len, reverse=True):
        text = text.replace(value, "[redacted]")
    return text


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


def chain_hashes(fields: Iterable[dict[str, Any]], prev_hash: str) -> list[str]:
    """The hashes of successive events' fields chained after ``prev_hash``."""
    hashes: list[str] = []
    for item in fields:
        prev_hash = compute_hash(item, prev_hash)
        hashes.append(prev_hash)
    return hashes


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
        before=_stored(before),
        after=_stored(after),
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
    """Insert ``events`` in order, unsealed, and have them sealed when the transaction commits.

    No lock: concurrent writers never wait for one another here (SQLite: sealed on insert)."""
    if not events:
        return
    if connection.vendor != "postgresql":
        _seal_on_insert(events)
        return
    _insert(events)
    _seal_after_commit(len(events))


_INSERT_COLUMNS = (("created_at", "timestamptz"), ("actor_id", "bigint"), ("actor_username", "varchar"),
                   ("tenant_id", "bigint"), ("project_id", "bigint"), ("action", "varchar"),
                   ("target_type", "varchar"), ("target_id", "varchar"), ("target_repr", "varchar"),
                   ("before", "jsonb"), ("after", "jsonb"), ("request_id", "varchar"),
                   ("client_ip", "inet"))


def _insert(events: list[AuditEvent]) -> None:
    """One ``INSERT … SELECT … FROM jsonb_to_recordset(%s) ORDER BY <list index>`` for the
    events, in list order (so a transaction's ids follow its events' order), ids set on the
    events. Hand-written because ``bulk_create`` compiles and binds every value in Python:
    ~0.4 s for the 1,600 events of a cycle's admissions (issue 13, round 3); ``json.dumps``
    is C. A JSON null is SQL NULL, as ``bulk_create`` writes ``None``."""
    rows = [{"created_at": e.created_at.isoformat(), "actor_id": e.actor_id,
             "actor_username": e.actor_username, "tenant_id": e.tenant_id, "project_id": e.project_id,
             "action": e.action, "target_type": e.target_type, "target_id": e.target_id,
             "target_repr": e.target_repr, "before": e.before, "after": e.after,
             "request_id": e.request_id, "client_ip": e.client_ip, "n": n} for n, e in enumerate(events)]
    names = ", ".join(c for c, _ in _INSERT_COLUMNS)
    types = ", ".join(f"{c} {t}" for c, t in _INSERT_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO tenants_auditevent ({names}) SELECT {names}"  # noqa: S608 - names are constants
            f" FROM jsonb_to_recordset(%s::jsonb) AS v({types}, n integer)"
            " ORDER BY n RETURNING id",
            [json.dumps(rows)])
        ids = sorted(row[0] for row in cursor.fetchall())
    for event, pk in zip(events, ids, strict=True):
        event.pk = pk
        event._state.adding, event._state.db = False, connection.alias


def _tail_of(seq: int | None, digest: str | None) -> tuple[int, str]:
    """A tail row's position and hash; the genesis hash at position 0 when there is none."""
    if seq is None or digest is None:
        return 0, GENESIS_HASH
    return int(seq), str(digest)


CHAIN_COLUMNS = ("hash", "prev_hash", "chain_seq")
"""An event's chain columns: all empty while it waits for a seal, all set once sealed."""


def _chain_columns(empty: bool) -> dict[str, bool]:
    """The ORM filter on ``CHAIN_COLUMNS``: all empty (``empty``) or all set."""
    return {f"{c}__isnull": empty for c in CHAIN_COLUMNS}


# The rows a seal pass chains, each carrying the chain's tail (``tail_seq``, ``tail_hash``; one
# snapshot, read under the lock); the rows' filter is ``_unsealed``'s. Written by hand, not with
# the ORM (``annotate(Subquery(...))``), because compiling that statement cost more than the
# rest of a single write's seal: 0.8–1.2 ms of CPU against 0.26–0.37 ms for this one through
# ``raw()`` (which maps the rows to events with the ORM's converters), and the two statements it
# replaces cost 0.86–0.89 ms, reading one unsealed row (``bench/hot_statements.py``; issue 35,
# docs/BENCHMARKS.md §15).
_UNSEALED_WITH_TAIL = (  # built from constants only (CHAIN_COLUMNS)
    "SELECT e.*, t.chain_seq AS tail_seq, t.hash AS tail_hash FROM tenants_auditevent AS e"  # noqa: S608
    " LEFT JOIN (SELECT chain_seq, hash FROM tenants_auditevent WHERE chain_seq IS NOT NULL"
    " ORDER BY chain_seq DESC LIMIT 1) AS t ON 1 = 1"
    " WHERE " + " AND ".join(f"e.{c} IS NULL" for c in CHAIN_COLUMNS) + " ORDER BY e.id LIMIT %s")


def _unsealed_with_tail(batch: int) -> tuple[list[AuditEvent], tuple[int, str]]:
    """Up to ``batch`` unsealed events in id order, and the chain's tail they read with
    (meaningless when there are none)."""
    rows = list(AuditEvent.objects.raw(_UNSEALED_WITH_TAIL, [batch]))
    return rows, _tail_of(*(getattr(rows[0], c) for c in ("tail_seq", "tail_hash")) if rows else (None, None))


def _chain_tail() -> tuple[int, str]:
    """The last sealed row's position and hash (the genesis hash at position 0)."""
    last = (AuditEvent.objects.filter(chain_seq__isnull=False).order_by("-chain_seq")
            .values_list("chain_seq", "hash").first())
    return _tail_of(*last) if last is not None else _tail_of(None, None)


def _seal_on_insert(events: list[AuditEvent]) -> None:
    """SQLite: one writer at a time, so chain the events as they are inserted."""
    seq, prev_hash = _chain_tail()
    for event in events:
        # As it will be read back (the database keeps microseconds, in UTC).
        event.created_at = event.created_at.astimezone(dt.UTC)
    for event, digest in zip(events, chain_hashes((_hashed_fields(e) for e in events), prev_hash),
                             strict=True):
        seq += 1
        event.prev_hash, event.hash, event.chain_seq = prev_hash, digest, seq
        prev_hash = digest
    AuditEvent.objects.bulk_create(events)


# A transaction that wrote more events than this (a scheduling cycle's admissions, a bulk
# submit) leaves their sealing to the Celery task instead of doing it before it returns.
SEAL_INLINE_MAX = 100


def _seal_after_commit(count: int) -> None:
    """Ask for one seal after the current transaction commits (once per transaction): in
    this process for a few events, else by the ``audit_seal`` task (a cycle's 1,600
    admission events take ~0.3–0.5 s to seal, which the cycle — and the cluster's lock it
    holds — need not wait for)."""
    hook = seal_quietly if count <= SEAL_INLINE_MAX else request_seal
    if not connection.in_atomic_block:
        hook()
        return
    if any(item[1] in (seal_quietly, request_seal) for item in connection.run_on_commit):
        return
    transaction.on_commit(hook, robust=True)


def request_seal() -> None:
    """Queue one ``tenants.tasks.audit_seal`` (requests coalesce while one is queued; the
    task clears the marker when it starts). A broker or cache that is down fails nothing:
    the beat's task seals within ``AUDIT_SEAL_SECONDS``."""
    from django.conf import settings
    from django.core.cache import cache

    try:
        if not cache.add(SEAL_QUEUED_KEY, 1, timeout=max(5, 2 * settings.AUDIT_SEAL_SECONDS)):
            return
    except Exception:  # noqa: BLE001 - cache down: the beat seals
        logger.warning("audit: seal request not queued; the beat task will seal", exc_info=True)
        return
    try:
        from tenants.tasks import audit_seal

        # No publish retries: a single write may call this after its commit, and a broker
        # that is down would otherwise hold its request for seconds.
        audit_seal.apply_async(retry=False)
    except Exception:  # noqa: BLE001 - broker down: the beat seals
        logger.warning("audit: seal request not queued; the beat task will seal", exc_info=True)
        with contextlib.suppress(Exception):
            cache.delete(SEAL_QUEUED_KEY)  # the next writer asks again instead of coalescing on nothing


SEAL_QUEUED_KEY = "camp:audit-seal-queued"


def seal_quietly() -> None:
    """After a writer's commit: one sealing pass, which takes the writer's rows and every
    other committed one. If another process holds the chain lock, it may already have read
    the unsealed rows before ours committed, so the ``audit_seal`` task is asked for
    (``request_seal``: requests coalesce) instead of waiting. Never fails the writer, whose
    transaction has committed.

    One pass, not two: a second pass only narrowed that race (a writer that committed during
    it still waited for the beat) and cost every single write one more transaction."""
    try:
        sealed = seal(wait=False, passes=1)
        if sealed is None or sealed >= SEAL_BATCH:  # lock held, or a backlog one pass did not end
            request_seal()
    except Exception:  # noqa: BLE001 - the beat task seals later; say why, do not fail the caller
        logger.exception("audit: sealing after commit failed; the beat task will seal")


@overload
def seal(*, wait: Literal[True] = ..., passes: int = ..., batch: int = ...) -> int: ...
@overload
def seal(*, wait: bool, passes: int = ..., batch: int = ...) -> int | None: ...
def seal(*, wait: bool = True, passes: int = 0, batch: int = SEAL_BATCH) -> int | None:
    """Chain every committed unsealed event after the last sealed one, in id order.

    Each pass is one short transaction under the chain lock: read the last sealed row
    (``chain_seq``, ``hash``), read up to ``batch`` unsealed rows in id order, compute their
    hashes from the rows as stored (what ``verify_chain`` recomputes), write them in one
    ``UPDATE … FROM jsonb_to_recordset``. ``wait``: block for the lock (verification, the
    beat task) instead of returning when another process holds it. ``passes``: at most this
    many transactions (0: until a pass finds less than a full batch). Returns how many rows
    were sealed; None when ``wait`` is False and the first pass found the lock held (nothing
    was sealed; the holder may have read the unsealed rows before the caller's committed, so
    the caller asks for another seal: ``seal_quietly``)."""
    sealed = 0
    done = 0
    while not passes or done < passes:
        done += 1
        with transaction.atomic():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    if wait:
                        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK_KEY])
                    else:
                        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_CHAIN_LOCK_KEY])
                        if not cursor.fetchone()[0]:
                            return sealed if done > 1 else None
            # the chain's tail rides on the rows (read under the lock, in the same snapshot):
            # one statement fewer in every single write's seal (issue 35)
            rows, (seq, prev_hash) = _unsealed_with_tail(batch)
            if not rows:
                return sealed
            for row in rows:
                row.created_at = row.created_at.astimezone(dt.UTC)
            values = []
            for row, digest in zip(rows, chain_hashes((_hashed_fields(r) for r in rows), prev_hash),
                                   strict=True):
                seq += 1
                values.append({"id": row.pk, "prev_hash": prev_hash, "hash": digest, "seq": seq})
                prev_hash = digest
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE tenants_auditevent AS e"
                    " SET prev_hash = v.prev_hash, hash = v.hash, chain_seq = v.seq"
                    " FROM jsonb_to_recordset(%s::jsonb)"
                    " AS v(id bigint, prev_hash varchar, hash varchar, seq bigint)"
                    " WHERE e.id = v.id AND e.hash IS NULL",
                    [json.dumps(values)],
                )
                if cursor.rowcount != len(values):  # cannot happen under the lock
                    raise RuntimeError("audit: rows were sealed by another process under the chain lock")
        sealed += len(rows)
        if not passes and len(rows) < batch:
            break  # all there was when this pass began; later commits ask for their own seal
    return sealed


@contextlib.contextmanager
def audit_batch() -> Iterator[None]:
    """Buffer the audit events of a transaction and insert them at its end, in one statement.

    One multi-row insert for all the transaction's events, in the order recorded. Record
    events after (not inside) any savepoint that may roll back: a buffered event is kept."""
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


def _unsealed() -> Any:
    """Rows committed and not chained yet: all three chain columns empty (what the trigger
    lets a seal fill). A row with some but not all of them set was not written by Camp and
    is never sealed; ``verify_chain`` names it."""
    return AuditEvent.objects.filter(**_chain_columns(empty=True))


def unsealed_count() -> int:
    return int(_unsealed().count())


def verify_chain(
    events: Iterable[AuditEvent] | None = None, *, seal_first: bool = True
) -> Iterator[ChainBreak]:
    """Yield every sealed row whose content or link no longer matches the chain, in chain
    order. Unsealed rows (committed, not yet chained) are not verified: by default they are
    sealed first; ``seal_first=False`` leaves them (``unsealed_count()`` says how many)."""
    if events is None and seal_first:
        seal(wait=True)
    rows = events if events is not None else (
        AuditEvent.objects.filter(chain_seq__isnull=False).order_by("chain_seq").iterator())
    prev = GENESIS_HASH
    for event in rows:
        # Reload timestamps as aware datetimes in UTC, as they were when hashed.
        event.created_at = event.created_at.astimezone(dt.UTC)
        if event.prev_hash != prev:
            yield ChainBreak(event.pk, "its link to the previous row is broken "
                             "(a row before it was removed or rewritten)")
        elif compute_hash(_hashed_fields(event), event.prev_hash or "") != event.hash:
            yield ChainBreak(event.pk, "its content does not match its hash (the row was edited)")
        prev = event.hash or ""
    if events is None:
        # Neither sealed (all three chain columns set) nor waiting (all three empty): a row
        # Camp did not write that way — e.g. one inserted with a hash but outside the chain.
        partial = (AuditEvent.objects
                   .exclude(**_chain_columns(empty=True)).exclude(**_chain_columns(empty=False))
                   .order_by("id").values_list("pk", flat=True))
        for pk in partial:
            yield ChainBreak(pk, "its chain columns are only partly set (it is outside the chain)")


# --- reading the log (the console's audit page, issue 32 finding 8) -------------------------

AUDIT_NAMED_KEYS = {"user": "user", "owner": "user", "actor": "user", "tenant": "tenant",
                    "project": "project", "cluster": "cluster"}
"""Snapshot keys holding an id the audit page shows as a name (``snapshot`` stores ids)."""
AUDIT_VALUE_CHARS = 48
"""A value longer than this is cut in the compact change (the full one is in the detail)."""


@dataclass(frozen=True)
class AuditChange:
    field: str
    before: str | None  # None: the field did not exist before (created)
    after: str | None  # None: it does not exist after (deleted)


def _audit_names(events: list[AuditEvent]) -> dict[str, dict[Any, str]]:
    """The names of the ids the events' snapshots hold: one query per kind named."""
    from .extensions import cluster_model

    ids: dict[str, set[Any]] = {kind: set() for kind in set(AUDIT_NAMED_KEYS.values())}
    for e in events:
        for side in (e.before, e.after):
            if isinstance(side, dict):
                for key, kind in AUDIT_NAMED_KEYS.items():
                    if isinstance(side.get(key), int):
                        ids[kind].add(side[key])
    names: dict[str, dict[Any, str]] = {}
    names["user"] = dict(User.objects.filter(pk__in=ids["user"]).values_list("pk", "username")) \
        if ids["user"] else {}
    names["tenant"] = dict(Tenant.objects.filter(pk__in=ids["tenant"]).values_list("pk", "name")) \
        if ids["tenant"] else {}
    names["project"] = {pk: f"{t}/{n}" for pk, t, n in Project.objects.filter(pk__in=ids["project"])
                        .values_list("pk", "tenant__name", "name")} if ids["project"] else {}
    names["cluster"] = dict(cluster_model()._default_manager.filter(pk__in=ids["cluster"])
                            .values_list("pk", "name")) if ids["cluster"] else {}
    return names


def _audit_value(key: str, value: Any, names: dict[str, dict[Any, str]]) -> str:
    kind = AUDIT_NAMED_KEYS.get(key)
    if kind and isinstance(value, int):
        return names.get(kind, {}).get(value, f"#{value} (deleted)")
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "), default=str)
    return text


def audit_changes(events: Iterable[AuditEvent]) -> dict[int, list[AuditChange]]:
    """Per event id, what changed, field by field, with names for the ids the snapshots hold
    (users, tenants, projects, clusters): a created object's fields (no before), a deleted
    one's (no after), an updated one's changed fields only. Values are whole; the page cuts
    long ones (``AUDIT_VALUE_CHARS``) and shows them whole in the expandable detail."""
    events = list(events)
    names = _audit_names(events)
    out: dict[int, list[AuditChange]] = {}
    for e in events:
        before = e.before if isinstance(e.before, dict) else ({} if e.before is None else {"value": e.before})
        after = e.after if isinstance(e.after, dict) else ({} if e.after is None else {"value": e.after})
        changes = []
        for key in list(before) + [k for k in after if k not in before]:
            b, a = before.get(key, _MISSING), after.get(key, _MISSING)
            if b == a:
                continue
            changes.append(AuditChange(
                key, None if b is _MISSING or e.before is None else _audit_value(key, b, names),
                None if a is _MISSING or e.after is None else _audit_value(key, a, names)))
        out[e.pk] = changes
    return out


_MISSING = object()
