"""Shared by the scheduling services: row locks, permission check, decision records, job audit,
and requests for a cycle or a reconcile (deduplicated, queued after commit)."""

from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import Error as DjangoDatabaseError
from django.db import connection, models, transaction
from django.utils import timezone

from tenants import permissions
from tenants.audit import audit_record
from tenants.models import User

from .. import signals
from ..models import (
    Job,
    SchedulingDecision,
)

logger = logging.getLogger(__package__)  # "scheduling.services", as before the split

SCHEDULER = "scheduler"  # actor_username of the scheduler's own audit events
MAX_ATTEMPTS = 5


def node_not_ready_toleration() -> int:
    """Seconds a node may be NotReady (or unreachable) before its jobs are rescheduled and
    its pods deleted — gracefully, as Kubernetes' taint manager does after the default
    ``tolerationSeconds`` of ``node.kubernetes.io/not-ready``/``unreachable`` (300).
    Setting ``CAMP_NODE_NOT_READY_TOLERATION_SECONDS`` (camp/settings/tasks.py)."""
    return int(settings.CAMP_NODE_NOT_READY_TOLERATION_SECONDS)


def not_ready_too_long(node: Any, now: dt.datetime | None = None) -> bool:
    """The node is NotReady and has been for the toleration (a node that left the cluster
    is another rule: its pods are gone, ``dispatch._on_dead_nodes``)."""
    if node.ready:
        return False
    since = node.not_ready_since or node.updated_at
    return bool((now or timezone.now()) - since >= dt.timedelta(seconds=node_not_ready_toleration()))
# Row locks here are ``select_for_update(no_key=True)``: FOR NO KEY UPDATE on PostgreSQL
# (ignored where row locks are not supported), and on a job of the job row only
# (``_locked_job``). Every update here leaves keys alone, and a plain FOR UPDATE would
# also block the foreign-key checks (FOR KEY SHARE) of other transactions
# inserting rows that point at the locked one (a decision or an audit event naming the job,
# its tenant, its project). Those checks run at COMMIT (deferred constraints), after the
# audit chain lock is taken: a cycle committing its decisions waited for a cancel's job lock
# while the cancel waited for the chain lock — a deadlock (seen in the apiserver fault test).


def _locked_job(pk: int) -> Job:
    """The job, its row locked (FOR NO KEY UPDATE of the job row alone) until the
    transaction ends, with its tenant and project read (not locked)."""
    return Job.objects.select_for_update(no_key=True, of=("self",)).select_related(
        "tenant", "project").get(pk=pk)


_CYCLE_LOCK_CLASS = 0x43414D50  # "CAMP": first key of the two-int advisory lock
_DISPATCH_LOCK_CLASS = 0x43414D44  # "CAMD": a job's dispatch in flight (key 2: job id)
_ALL_CLUSTERS_LOCK_CLASS = 0x43414D55  # "CAMU": a tenant's GPU use across clusters (key 2: tenant id)
STORAGE_LOCK_CLASS = 0x43414D53  # "CAMS": a project's volumes against its storage limit (key 2: project id)


def xact_locks(key_class: int, keys: Iterable[int]) -> None:
    """PostgreSQL transaction-level advisory locks ``(key_class, key)``, taken in ascending
    key order (two holders never wait on each other in a circle) and released at commit or
    rollback, when what the holder counted and wrote is visible to the next one. This is how
    a quota checked by counting rows holds under concurrent writers: the GPU quotas across
    clusters (``cycle._lock_all_clusters``) and the storage limit (``workspaces.quota``).
    Taken again in the same transaction, a lock is already held: no wait. Must run inside
    ``transaction.atomic`` (outside one it would be released at once); other databases
    (the SQLite demo) serialise writers anyway and take nothing."""
    if connection.vendor != "postgresql":
        return
    if not connection.in_atomic_block:
        raise RuntimeError("xact_locks() needs a transaction: it would be released at once.")
    with connection.cursor() as cursor:
        for key in sorted(set(keys)):
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [key_class, key])


@contextlib.contextmanager
def session_lock(key_class: int, key: int, *, wait: bool = False) -> Iterator[bool]:
    """A PostgreSQL session-level advisory lock ``(key_class, key)``. It waits for the lock
    with ``wait``, else takes it only if it is free. It yields whether the lock was taken and
    releases it on leaving; a killed worker's lock goes with its connection. The cycle, the
    placement step and a dispatch use it; PostgreSQL only.

    If the release fails, the session may still hold the lock: a statement inside may have
    aborted the caller's transaction, or the connection may have broken. A pooled or
    persistent connection would then carry the lock on into later work, and every other
    waiter would be shut out for as long as the connection lives. So the session is ended
    instead (``_end_session``), and PostgreSQL releases its locks with it. An error raised
    inside reaches the caller as it was; a failed release after a clean exit is raised."""
    with connection.cursor() as cursor:
        if wait:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [key_class, key])
            got = True
        else:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [key_class, key])
            row = cursor.fetchone()
            got = bool(row and row[0])
    if not got:
        yield False
        return
    try:
        yield True
    except BaseException:
        _session_unlock(key_class, key, failing=True)  # the caller's own error goes on
        raise
    _session_unlock(key_class, key, failing=False)


def _session_unlock(key_class: int, key: int, *, failing: bool) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [key_class, key])
    except DjangoDatabaseError:
        logger.warning("advisory lock (%s, %s) not released in its session: ending the session",
                       key_class, key)
        _end_session()
        if not failing:
            raise


def session_try_lock(key_class: int, key: int) -> contextlib.AbstractContextManager[bool]:
    """``session_lock`` if it is free (does not wait)."""
    return session_lock(key_class, key, wait=False)


def _end_session() -> None:
    """Close this thread's database session for good. The raw connection is closed first, so
    a pool discards it rather than taking it back, and Django opens a new one on next use."""
    raw = connection.connection
    if raw is not None:
        with contextlib.suppress(Exception):  # already broken: closed is what we want
            raw.close()
    with contextlib.suppress(DjangoDatabaseError):
        connection.close()


def _require(actor: Any, action: str, obj: Any) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


def _record_all(decisions: list[SchedulingDecision]) -> None:
    """Insert history rows in bulk and tell observers (live pages) which jobs changed."""
    if not decisions:
        return
    if connection.vendor == "postgresql":
        _record_rows([_decision_row(d) for d in decisions])
        return
    SchedulingDecision.objects.bulk_create(decisions, batch_size=2000)
    signals.decisions_recorded.send_robust(sender=SchedulingDecision,
                                           job_ids=[d.job_id for d in decisions])


def _record_rows(rows: list[dict[str, Any]]) -> None:
    """``_record_all`` for rows given as plain dicts (``job_id``, ``cluster_id``, ``kind``,
    ``reason``, optionally ``queue_position``, ``placement``, ``victims``, ``preemptor_id``):
    a sweep's first cycle records ~18,000 "waiting" rows, and building a model for each
    cost ~1 s of CPU (issue 13, round 3)."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        _record_all([SchedulingDecision(**row) for row in rows])
        return
    _insert_decisions(rows)
    signals.decisions_recorded.send_robust(sender=SchedulingDecision,
                                           job_ids=[row["job_id"] for row in rows])


def _decision_row(d: SchedulingDecision) -> dict[str, Any]:
    return {"job_id": d.job_id, "cluster_id": d.cluster_id, "kind": d.kind, "reason": d.reason,
            "queue_position": d.queue_position, "placement": d.placement, "victims": d.victims,
            "preemptor_id": d.preemptor_id, "created_at": d.created_at}


_DECISION_COLUMNS = (("job_id", "bigint"), ("cluster_id", "bigint"), ("kind", "varchar"),
                     ("reason", "varchar"), ("queue_position", "integer"), ("placement", "jsonb"),
                     ("victims", "jsonb"), ("preemptor_id", "bigint"), ("created_at", "timestamptz"))


def _json_value(value: Any) -> Any:
    """What ``json.dumps`` cannot send itself, as PostgreSQL reads it back from JSON text."""
    if isinstance(value, dt.date | dt.time):  # datetimes too
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _insert_decisions(rows: list[dict[str, Any]]) -> None:
    """``INSERT … SELECT … FROM jsonb_to_recordset(%s)``: the rows travel as one JSON
    parameter. Hand-written because ``bulk_create`` compiles and quotes every value in
    Python (about 1 s for the 18,000 "waiting" rows of a sweep's first cycle, issue 13);
    ``json.dumps`` is C. Same columns and values as ``bulk_create``, one ``created_at``
    (absent keys: the model's defaults — no position, placement or preemptor, no victims)."""
    now = timezone.now().isoformat()
    for row in rows:
        if row.get("victims") is None:
            row["victims"] = []
        if row.get("created_at") is None:
            row["created_at"] = now
    qn = connection.ops.quote_name
    names = ", ".join(qn(c) for c, _ in _DECISION_COLUMNS)
    types = ", ".join(f"{qn(c)} {t}" for c, t in _DECISION_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {qn(SchedulingDecision._meta.db_table)} ({names}) "  # noqa: S608
            f"SELECT {names} FROM jsonb_to_recordset(%s::jsonb) AS v({types})",
            [json.dumps(rows, default=_json_value)])


def _insert_rows(model: type[models.Model], rows: list[dict[str, Any]], *,
                 returning: tuple[str, ...] = ()) -> list[tuple[Any, ...]]:
    """PostgreSQL: ``INSERT INTO <table> SELECT … FROM jsonb_to_recordset(%s)`` of ``rows``
    (column → value; a column left out takes the model's default, ``auto_now(_add)`` the
    time now), returning ``returning`` of each row inserted (in no promised order). Every
    concrete column but the primary key is written, typed as the model declares it, so a field
    added to the model is written too; its values must be what ``_json_value`` can send
    (JSON, datetimes, dates, decimals, UUIDs). Hand-written for the reason of ``_insert_decisions``:
    ``bulk_create`` builds a model and compiles each value in Python (~0.3 s for a burst's
    8,000 allocations and their slices); ``json.dumps`` is C. Constraints still apply: a
    refusal raises ``IntegrityError`` as ``bulk_create`` would."""
    if not rows:
        return []
    now = timezone.now()
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    defaults: dict[str, Any] = {}
    for f in fields:
        auto = getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
        defaults[str(f.column)] = now if auto else f.get_default()
    data = json.dumps([{**defaults, **row} for row in rows], default=_json_value)
    qn = connection.ops.quote_name
    names = ", ".join(qn(str(f.column)) for f in fields)
    types = ", ".join(f"{qn(str(f.column))} {f.db_type(connection)}" for f in fields)
    back = f" RETURNING {', '.join(qn(c) for c in returning)}" if returning else ""
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {qn(model._meta.db_table)} ({names}) "  # noqa: S608 - names from the model
                       f"SELECT {names} FROM jsonb_to_recordset(%s::jsonb) AS v({types}){back}", [data])
        return [tuple(r) for r in cursor.fetchall()] if returning else []


def _record(job: Job, kind: str, reason: str = "", **extra: Any) -> SchedulingDecision:
    return SchedulingDecision.objects.create(
        job=job, cluster_id=job.cluster_id, kind=kind, reason=reason[:500], **extra
    )


def _audit_job(action: str, job: Job, *, actor: User | None = None, **extra: Any) -> None:
    audit_record(
        actor=actor, actor_username=None if actor is not None else SCHEDULER, action=action,
        target=job, tenant=job.tenant, project=job.project, **extra,
    )


# --- cycle requests ------------------------------------------------------------------------


def request_cycle(cluster_id: int | None, *, countdown: float | None = None) -> None:
    """Ask for one scheduling cycle of a cluster after the current transaction commits
    (``None``: a floating job with no cluster yet; the placement step asks for its cycle).

    Requests coalesce: while one cycle is queued and not yet started, more requests add
    nothing (the queued one will see every job committed before it starts). The marker
    lives two beat ticks at most, so a request lost with its message (a broker restart)
    holds back no later one for longer. A broker or cache that is down never fails the
    caller's committed work: the beat's ``scheduler_tick`` asks again from the database."""
    if cluster_id is None:
        return
    try:
        if not cache.add(f"camp:cycle-queued:{cluster_id}", 1,
                         timeout=max(5, 2 * settings.SCHEDULER_TICK_SECONDS)):
            return
    except Exception:  # redis-py's ConnectionError and kin: the cache is down
        logger.warning("cycle request for cluster %s not queued (cache unavailable)", cluster_id)
        return
    _send_after_commit("cluster_cycle", cluster_id, countdown=countdown)


def _task(name: str) -> Any:
    """``scheduling.tasks.<name>``: the one place the services reach their tasks module. It is
    imported at call time because the tasks import the services (no import cycle at load)."""
    from .. import tasks

    return getattr(tasks, name)


def enqueue(task_name: str, *args: Any) -> None:
    """Queue ``scheduling.tasks.<task_name>`` now."""
    _task(task_name).delay(*args)


def enqueue_on_commit(task_name: str, *args: Any) -> None:
    """Queue ``scheduling.tasks.<task_name>`` once the transaction commits."""
    _task(task_name).delay_on_commit(*args)


def _send_after_commit(task_name: str, *args: Any, countdown: float | None = None) -> None:
    """Queue ``scheduling.tasks.<task_name>`` once the transaction commits; a broker that is down
    is logged, not raised (robust on_commit): the row is the truth and the periodic tick
    re-requests it."""
    task = _task(task_name)
    kwargs = {"countdown": countdown} if countdown else {}
    transaction.on_commit(lambda: task.apply_async(args, **kwargs), robust=True)


def cycle_request_taken(cluster_id: int) -> None:
    cache.delete(f"camp:cycle-queued:{cluster_id}")


RECONCILE_REQUEST_SECONDS = 60
"""A queued periodic run (reconcile, inventory …) lost with a killed worker is asked for again
after this long (``clusters.periodic_request``)."""


def _update_from_values(model: type[models.Model], columns: list[tuple[str, str]],
                        rows: list[tuple[Any, ...]], *, where: tuple[str, Any] | None = None
                        ) -> set[int]:
    """``UPDATE <table> SET col = v.col … FROM jsonb_to_recordset(<rows>) v WHERE id = v.id`` and,
    if given, ``where`` (column, value or list of values): only rows whose column has that
    value (one of them); returns the
    primary keys updated. Hand-written because Django's ``bulk_update`` writes one CASE WHEN
    per row and column, can add no per-row guard and does not say which rows it changed.
    Column names and types come from this module, never from input; values are parameters."""
    if not rows:
        return set()
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    pk = qn(str(model._meta.pk.column))  # type: ignore[union-attr]
    sets = ", ".join(f"{qn(c)} = v.{qn(c)}" for c, _ in columns)
    guard = ""
    extra: list[Any] = []
    if where is not None and isinstance(where[1], list):  # one of several values
        guard = f" AND t.{qn(where[0])} IN ({', '.join(['%s'] * len(where[1]))})"
        extra = list(where[1])
    elif where is not None:
        guard = f" AND t.{qn(where[0])} = %s"
        extra = [where[1]]
    done: set[int] = set()
    if connection.vendor != "postgresql":  # the demo's SQLite: row by row, same guard
        for row in rows:
            with connection.cursor() as cursor:
                assigns = ", ".join(f"{qn(c)} = %s" for c, _ in columns)
                cursor.execute(f"UPDATE {table} AS t SET {assigns} WHERE t.{pk} = %s{guard}",  # noqa: S608
                               [*row[1:], row[0], *extra])
                if cursor.rowcount:
                    done.add(row[0])
        return done
    # The rows travel as one JSON parameter (json.dumps is C; the driver would quote
    # array parameters element by element in Python: ~1 s for 18,000 rows).
    keys = ["id", *(c for c, _ in columns)]
    types = ", ".join(["id bigint", *(f"{qn(c)} {t}" for c, t in columns)])
    data = json.dumps([dict(zip(keys, row, strict=True)) for row in rows], default=_json_value)
    sql = (f"UPDATE {table} AS t SET {sets} FROM jsonb_to_recordset(%s::jsonb) "  # noqa: S608
           f"AS v({types}) WHERE t.{pk} = v.id{guard} RETURNING t.{pk}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [data, *extra])
        done.update(r[0] for r in cursor.fetchall())
    return done
