"""The job lifecycle: the one writer of ``Job.state`` (DESIGN.md §5, issue 29).

Every change of a job's state is a row of ``TRANSITIONS``: the states it may leave, the state it
enters, the decision row it records (the job's history), the audit event it writes, and what
runs after commit. Two writers apply a row, with the same guard and the same records:

- ``transition(job, name, ...)``: one job — one conditional UPDATE (only while the job is in
  one of the row's from-states), its decision row, its audit event, its after-commit work;
- ``transition_many(name, moves, ...)``: a plan of many jobs (the cycle's admissions and
  preemptions) — one UPDATE for all of them (same guard), their decision rows in one insert,
  one audit event each, one after-commit task for all.

Both return what they changed: a job whose row left the from-states meanwhile (a cancel racing
a cycle) is not changed and records nothing. A layering test (tests/unit/test_lifecycle_layering.py)
asserts that no other module assigns ``Job.state``. The submit (no state → QUEUED) is a row too:
the job row is created in that state (the model's default) by ``jobs.job_submit``, which
records the row's decision and audit event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Expression
from django.utils import timezone

from tenants.audit import audit_record
from tenants.models import User

from ..models import ACTIVE_STATES, FINAL_STATES, DecisionKind, Job, JobState, SchedulingDecision
from .common import (
    SCHEDULER,
    _record_all,
    _send_after_commit,
    _update_from_values,
    enqueue_on_commit,
    request_cycle,
)

Q, S, R, P = JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING
ALIVE = (Q, S, R, P)  # every state that is not final


@dataclass(frozen=True, slots=True)
class Transition:
    """One row of the lifecycle table."""

    name: str
    sources: tuple[str, ...]
    """The from-states: the UPDATE changes the job only while it is in one of them."""
    to: str
    decision: str
    """The ``SchedulingDecision.kind`` recorded (the job's history, the API's ``decisions``)."""
    audit: str
    """The ``AuditEvent.action`` written, once per job changed, in the same transaction."""
    after: str
    """What runs after commit: ``dispatch`` (create its pods), ``stop`` (delete its pods and
    release what it holds), ``cycle`` (a cycle of its cluster, to use what it freed or retry
    it), ``stop-or-cycle`` (``stop`` when it left an active state, else ``cycle``), or ""."""


TRANSITIONS: dict[str, Transition] = {t.name: t for t in (
    Transition("submit", (), Q, DecisionKind.SUBMITTED, "job.submitted", "cycle"),
    Transition("admit", (Q,), S, DecisionKind.ADMITTED, "job.admitted", "dispatch"),
    Transition("start", (S,), R, DecisionKind.STARTED, "job.started", ""),
    Transition("preempt", (S, R), P, DecisionKind.PREEMPTED, "job.preempted", "stop"),
    Transition("evict", (S, R), P, DecisionKind.PREEMPTED, "job.evicted", "stop"),
    Transition("requeue", (S, R, P), Q, DecisionKind.REQUEUED, "job.requeued", "cycle"),
    Transition("reject", (Q,), JobState.REJECTED, DecisionKind.REJECTED, "job.rejected", ""),
    Transition("succeed", (S, R), JobState.SUCCEEDED, DecisionKind.FINISHED, "job.succeeded", "stop"),
    Transition("fail", (S, R), JobState.FAILED, DecisionKind.FAILED, "job.failed", "stop"),
    Transition("cancel", ALIVE, JobState.CANCELLED, DecisionKind.CANCELLED, "job.cancelled",
               "stop-or-cycle"),
)}
"""The lifecycle table (docs/ARCHITECTURE.md, "The job lifecycle")."""


def _entry(t: Transition, now: dt.datetime) -> dict[str, Any]:
    """Columns every job entering ``t.to`` gets: a final job is out of its queue with an end
    time; a requeued one has not started; a job leaving the queue has no position there."""
    if t.to in FINAL_STATES:
        return {"reason_kind": "", "queue_position": None, "queue_length": None, "finished_at": now}
    if t.to == Q:
        return {"started_at": None, "preempted_by_id": None}
    if t.to == R:
        return {"started_at": now, "reason_kind": ""}
    if t.to == S:
        return {"queue_position": None, "queue_length": None}
    return {}


_ENTRY_TYPES = {"reason_kind": "varchar", "queue_position": "integer", "queue_length": "integer",
                "finished_at": "timestamptz", "started_at": "timestamptz", "preempted_by_id": "bigint"}


def transition(job: Job, name: str, *, reason: str, actor: User | None = None,
               actor_username: str | None = None, fields: dict[str, Any] | None = None,
               where: dict[str, Any] | None = None, audit: dict[str, Any] | None = None,
               said: str | None = None, decision: dict[str, Any] | None = None,
               countdown: float | None = None) -> bool:
    """Move one job along row ``name`` of ``TRANSITIONS``; False (nothing written) when the
    job is not in one of the row's from-states (or does not match ``where``, e.g. its cluster).

    ``reason``: the job's new reason (also its decision's, unless ``said``); ``fields``: other
    columns written with the state (values or expressions such as ``F("attempts") + 1``);
    ``audit``: the event's ``after`` (default: the reason), its ``before`` is the state left;
    ``decision``: more fields of the decision row (``placement``, ``preemptor``…). The job
    should be loaded with its tenant and project (the audit event names them). Call inside the
    caller's transaction; the after-commit work is queued on it."""
    t = TRANSITIONS[name]
    now = timezone.now()
    before = job.state
    values = {**_entry(t, now), "state": t.to, "reason": reason[:500], **(fields or {}),
              "updated_at": now}
    if not Job.objects.filter(pk=job.pk, state__in=t.sources, **(where or {})).update(**values):
        return False
    for key, value in values.items():
        if not isinstance(value, Expression):
            setattr(job, key, value)
    SchedulingDecision.objects.create(job=job, cluster_id=job.cluster_id, kind=t.decision,
                                      reason=(said if said is not None else reason)[:500],
                                      **(decision or {}))
    _audit(t, job, before, audit if audit is not None else {"reason": job.reason}, actor, actor_username)
    _after(t, [job], {job.pk: before}, countdown)
    return True


@dataclass(slots=True)
class Move:
    """One job of a plan given to ``transition_many``."""

    job: Job
    reason: str
    values: tuple[Any, ...] = ()
    """The values of the plan's ``columns``, in their order."""
    said: str | None = None
    """The decision's reason, when not the job's."""
    decision: dict[str, Any] = field(default_factory=dict)
    audit: dict[str, Any] | None = None


def transition_many(name: str, moves: list[Move], *, columns: Iterable[tuple[str, str]] = (),
                    countdown: float | None = None) -> set[int]:
    """Move a plan of jobs along row ``name`` in bulk, with ``transition``'s guard and records:
    one UPDATE (``state``, ``reason`` and ``columns`` — (name, SQL type) — for each job, only
    jobs still in a from-state), one insert of their decisions, one audit event per job
    changed, one after-commit task. Returns the ids changed. Inside the caller's transaction."""
    t = TRANSITIONS[name]
    columns = list(columns)
    if not moves:
        return set()
    now = timezone.now()
    entry = {k: v for k, v in _entry(t, now).items() if k not in {c for c, _ in columns}}
    columns = [*((k, _ENTRY_TYPES[k]) for k in entry), *columns]
    updated = _update_from_values(
        Job, [("state", "varchar"), ("reason", "varchar"), ("updated_at", "timestamptz"), *columns],
        [(m.job.pk, t.to, m.reason[:500], now, *entry.values(), *m.values) for m in moves],
        where=("state", list(t.sources)))
    history: list[SchedulingDecision] = []
    changed: list[Job] = []
    before: dict[int, str] = {}
    for m in moves:
        if m.job.pk not in updated:
            continue
        before[m.job.pk] = m.job.state
        m.job.state, m.job.reason = t.to, m.reason[:500]
        for (col, _), value in zip(columns, (*entry.values(), *m.values), strict=True):
            setattr(m.job, col, value)
        history.append(SchedulingDecision(job_id=m.job.pk, cluster_id=m.job.cluster_id, kind=t.decision,
                                          reason=(m.said if m.said is not None else m.reason)[:500],
                                          **m.decision))
        _audit(t, m.job, before[m.job.pk], m.audit if m.audit is not None else {"reason": m.reason},
               None, None)
        changed.append(m.job)
    _record_all(history)
    _after(t, changed, before, countdown)
    return updated


def _audit(t: Transition, job: Job, before: str, after: dict[str, Any], actor: User | None,
           actor_username: str | None) -> None:
    audit_record(actor=actor, actor_username=actor_username if actor_username is not None
                 else (None if actor is not None else SCHEDULER),
                 action=t.audit, target=job, tenant=job.tenant, project=job.project,
                 before={"state": before}, after=after)


def _after(t: Transition, jobs: list[Job], before: dict[int, str], countdown: float | None) -> None:
    """The row's after-commit work for the jobs changed (one task for a plan)."""
    if not jobs:
        return
    stop = [j.pk for j in jobs if t.after == "stop" or (
        t.after == "stop-or-cycle" and before[j.pk] in ACTIVE_STATES)]
    cycle = {j.cluster_id for j in jobs if t.after == "cycle" or (
        t.after == "stop-or-cycle" and before[j.pk] not in ACTIVE_STATES)}
    if t.after == "dispatch":
        if len(jobs) == 1:
            enqueue_on_commit("job_dispatch", jobs[0].pk)
        else:
            enqueue_on_commit("jobs_dispatch", [j.pk for j in jobs])
    if len(stop) == 1:
        # Tied to the attempt being stopped (dispatch.job_stop): redelivered late, it never
        # touches the next attempt's pods of the same names.
        _send_after_commit("job_stop", stop[0], jobs[0].attempts)
    elif stop:
        _send_after_commit("jobs_stop", sorted(stop))
    for cluster_id in sorted(c for c in cycle if c is not None):
        request_cycle(cluster_id, countdown=countdown)
