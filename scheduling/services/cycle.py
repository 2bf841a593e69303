"""The scheduling cycle: one cycle per cluster at a time, the engine run on a consistent read, and
the writes of its decisions (admissions, preemptions, waits) in bulk."""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import gc
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduling import engine as E
from scheduling.engine import multicluster as M
from scheduling.engine.cycle import CycleConfig, CycleResult, JobStatus, run_cycle
from tenants.audit import audit_batch

from .. import selectors, signals
from ..backends.naming import pod_name
from ..models import (
    EXTERNAL_KIND,
    Allocation,
    Cluster,
    DecisionKind,
    ExternalPod,
    GpuDevice,
    GpuSlice,
    Job,
    JobState,
    ProjectNamespace,
    SchedulingDecision,
)
from . import all_clusters
from . import write_policy as policy
from .clusters import ClosedWhy, cluster_closed_why
from .common import (
    _ALL_CLUSTERS_LOCK_CLASS,
    _CYCLE_LOCK_CLASS,
    _audit_job,
    _insert_rows,
    _record_all,
    _record_rows,
    _update_from_values,
    logger,
    session_try_lock,
    xact_locks,
)
from .dispatch import project_namespace_ensure
from .jobs import _preempted_reason
from .lifecycle import Move, transition, transition_many

# --- the scheduling cycle ------------------------------------------------------------------


@contextlib.contextmanager
def cycle_lock(cluster_id: int) -> Iterator[bool]:
    """One cycle per cluster at a time, across any number of workers.

    PostgreSQL: a session-level advisory lock, released here (or when a killed worker's
    connection drops), so that the cycle can read, decide and write in separate short
    transactions. SQLite (the demo): an exclusive file lock."""
    if connection.vendor == "postgresql":
        with session_try_lock(_CYCLE_LOCK_CLASS, cluster_id) as got:
            yield got
        return
    lock_dir = settings.VAR_DIR / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    with open(lock_dir / f"cycle-{cluster_id}.lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _consistent_read() -> Iterator[None]:
    """A read-only transaction that sees one snapshot of the database (REPEATABLE READ on
    PostgreSQL), so nodes, GPU totals, allocations and jobs agree with each other. Inside
    an outer transaction (tests) the outer one's view is used."""
    outer = connection.in_atomic_block
    with transaction.atomic():
        if connection.vendor == "postgresql" and not outer:
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield


@dataclass
class CycleSummary:
    admitted: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    preempting: list[int] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)
    unplaced: list[int] = field(default_factory=list)
    """Floating jobs sent back to the global queue by a closed cluster's cycle (``closed_hold``)."""
    closed: str = ""
    """Why the cluster took no new work this cycle ("cluster west is unreachable"), or ""."""


def engine_policy(name: str) -> E.Policy | None:
    """The engine policy for a cluster's ``placement_policy``; None is the engine's default
    (fragmentation-aware, profiled on the pending workload)."""
    shapes = {"binpack": ("binpack", "binpack"), "spread": ("spread", "spread"),
              "binpack-spread": ("binpack", "spread"), "spread-binpack": ("spread", "binpack")}
    if name in shapes:
        node, card = shapes[name]
        return E.ResourcePolicy(node=node, card=card, name=name)  # type: ignore[arg-type]
    return None


def cycle_run(*, cluster: Cluster, now: float | None = None) -> CycleSummary | None:
    """One scheduling cycle of ``cluster``; None when another cycle holds the lock.

    Three steps under the cluster's lock, none of them long in a transaction: read a
    consistent snapshot; let the engine decide (no transaction open); persist the decisions
    in one short transaction with bulk statements and optimistic checks (``_apply``): a job
    that left QUEUED meanwhile, or whose GPUs' totals moved since the snapshot, is not
    admitted, nor does it preempt (it waits for the next cycle) while the rest of the cycle
    goes through. Pods
    are created after commit (``job_dispatch``)."""
    started = time.perf_counter()
    with cycle_lock(cluster.pk) as got:
        if not got:
            return None
        # Nothing queued: an idle tick (a closed cluster has nothing to hold back either), so
        # its state is read only when there is work to judge.
        queued = Job.objects.filter(cluster=cluster, state=JobState.QUEUED).exists()
        why = _closed(cluster) if queued else None
        if why is not None:
            summary = closed_hold(cluster, why)
        else:
            inputs, statuses = _decide(cluster, now, queued=queued)
            summary = _persist(cluster, inputs, statuses)
    signals.cycle_finished.send_robust(
        sender=Cluster, cluster_id=cluster.pk, seconds=time.perf_counter() - started,
        admitted=len(summary.admitted), waiting=len(summary.waiting),
        rejected=len(summary.rejected), preempting=len(summary.preempting),
    )
    return summary


def _closed(cluster: Cluster) -> ClosedWhy | None:
    """Whether the cluster takes no new work (disabled, or its API server does not answer),
    read now under its cycle lock (the caller's row may be older)."""
    row = Cluster.objects.filter(pk=cluster.pk).only(
        "name", "enabled", "unreachable_since", "last_error").first()
    return cluster_closed_why(row) if row is not None else None


def closed_hold(cluster: Cluster, why: ClosedWhy) -> CycleSummary:
    """The cycle of a cluster that takes no new work (the caller holds its cycle lock): it
    admits, preempts and rejects nothing (it could not create or delete pods, and a disabled
    one is out of service); its queued floating jobs go back to the global queue, its
    queued pinned jobs wait with ``why.pinned`` (kind ``cluster``, one history row when the
    reason changes). The next cycle after it is enabled or answers again decides as usual."""
    from .placement import job_unplace  # placement imports this module

    summary = CycleSummary(closed=why.floating)
    with transaction.atomic(), audit_batch():
        for pk in Job.objects.filter(cluster_id=cluster.pk, floating=True, state=JobState.QUEUED
                                     ).order_by("pk").values_list("pk", flat=True):
            if job_unplace(job_id=pk, reason=why.floating, locked=True, from_cluster=cluster.pk):
                summary.unplaced.append(pk)
        pinned = list(Job.objects.filter(cluster_id=cluster.pk, floating=False, state=JobState.QUEUED)
                      .only("pk", "cluster_id", "reason", "reason_kind", "queue_position", "queue_length"))
        _wait_all([_WaitRow(j, why.pinned, "cluster", None, None) for j in pinned])
        summary.waiting = [j.pk for j in pinned]
    return summary


def _decide(cluster: Cluster, now: float | None, queued: bool | None = None,
            ) -> tuple[selectors.CycleInputs, list[JobStatus]]:
    """The snapshot (one consistent read) and the engine's decisions (no transaction open).
    Nothing queued (``queued``: already known by the caller): nothing to decide, and no
    snapshot to read (an idle tick is one query)."""
    if queued is None:
        queued = Job.objects.filter(cluster=cluster, state=JobState.QUEUED).exists()
    if not queued:
        return selectors.CycleInputs.empty(), []
    with _gc_paused(), _consistent_read():
        limits = selectors.all_cluster_limits()
        use = selectors.all_cluster_use(limits.tenant_ids) if limits else None
        inputs = selectors.cycle_inputs(cluster)
        # The guarantees across all clusters split into per-cluster parts (from the same
        # snapshot as the usage): this cluster's part joins each owner's guarantee here.
        parts = all_clusters.guarantees(limits, use, names=True) if limits and use is not None else None
        if Job.objects.filter(cluster=cluster, state=JobState.QUEUED, floating=True).exists():
            from .placement import quota_times  # placement imports this module

            inputs = replace(inputs, quota_times=quota_times([cluster.pk]))
    held = all_clusters.Held([], {})
    if limits and use is not None:
        # Quotas across all clusters (the snapshot's usage on every cluster): a job that
        # would cross one waits, said why, and is not offered to the engine — not a lowered
        # per-cluster limit, which the engine would take as "can never run" and reject. Jobs
        # within go on; several together may still cross one: ``_within_all_clusters``.
        inputs, held = all_clusters.hold(inputs, limits, use, parts)
    if not inputs.pending:
        return inputs, held.statuses
    with _gc_paused():
        result = _run_engine(cluster, inputs, now)
    statuses = list(result.statuses.values())
    if held.closed:
        statuses = all_clusters.reopen(statuses, held.closed)
    return inputs, [*held.statuses, *statuses]


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while the snapshot and the engine build hundreds of
    thousands of small objects (none of them garbage yet): CPython would otherwise walk
    them all again and again (0.3–0.5 s of a 20,000-job snapshot). Bounded: re-enabled after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def cycle_config() -> CycleConfig:
    """The engine's knobs for a cluster's cycle, from settings (the service and the benchmarks
    use this one reading).

    Heads of queues: ``SCHEDULER_HEADS_PER_QUEUE`` (default 8; 0: all) bounds a cycle's work on
    a full cluster, where every tried job that does not fit searches for victims. On a cluster
    with room that bound only costs cycles: 10,000 jobs behind 200 queues took ten cycles to
    reach the ones that fit (issue 13). So, with ``SCHEDULER_HEADS_FILL`` (default on), each
    queue also offers the jobs whose asks fit in its share of the free room, and the cycle
    refills the room its first pass left (the engine's rule ``CycleConfig.heads_fill``). The
    engine still orders all offered heads by fair share and priority, so the room goes to
    queues in the same order."""
    base = settings.SCHEDULER_HEADS_PER_QUEUE
    return CycleConfig(heads_per_queue=base or None,
                       heads_fill=bool(base) and getattr(settings, "SCHEDULER_HEADS_FILL", True))


def _run_engine(cluster: Cluster, inputs: selectors.CycleInputs, now: float | None) -> CycleResult:
    return run_cycle(
        inputs.snapshot, inputs.pending, inputs.tree,
        now=now if now is not None else timezone.now().timestamp(),
        running=inputs.running,
        # Kueue-style heads of queues: a cycle tries the first jobs of each project (the rest
        # wait "behind" with their position); the task re-runs while it admits.
        config=cycle_config(),
        policy=engine_policy(cluster.placement_policy),
    )


def _persist(cluster: Cluster, inputs: selectors.CycleInputs, statuses: list[JobStatus]) -> CycleSummary:
    """Write the decisions in one short transaction; audit events chained in one insert
    at its end (``audit_batch``)."""
    summary = CycleSummary()
    with transaction.atomic(), audit_batch():
        _apply(inputs, statuses, summary)
        Cluster.objects.filter(pk=cluster.pk).update(last_cycle_at=timezone.now())
    return summary


ADMITTED_REASON = "Admitted; creating pods"
CONFLICT_REASON = "Its placement was taken concurrently; retrying in the next cycle"


def _apply(inputs: selectors.CycleInputs, statuses: list[JobStatus], summary: CycleSummary) -> None:
    """Persist one cycle's decisions (inside the caller's transaction).

    Admissions, preemptions and waits are written in bulk (``_admit_all``, ``_preempt_all``,
    ``_wait_all``); rejections, a handful per cycle, job by job. The outcome is the one the
    row-by-row path gave (tests/integration/scheduling/test_cycle_equivalence.py)."""
    admits: list[tuple[Job, E.Placement, JobStatus]] = []
    preemptions: list[tuple[Job, E.Preempt]] = []
    waits: list[_WaitRow] = []
    # The snapshot holds rows, not models: the jobs admitted, preempting, preempted or
    # rejected (a few thousand at most) are loaded as models in one query for their writes.
    acting = {int(st.job) for st in statuses if not isinstance(st.decision, E.Wait)}
    acting.update(int(v) for st in statuses if isinstance(st.decision, E.Preempt)
                  for v in st.decision.victims)
    models_ = selectors.job_models(sorted(acting))
    memo: dict[str, Any] = {}
    for status in statuses:
        row, d = inputs.jobs[status.job], status.decision
        if isinstance(d, (E.Admit, E.Preempt)):
            blocked = policy.outside_pools(inputs.pools, row.tenant_id, d.placement)
            if blocked:
                waits.append(_WaitRow(row, blocked, "capacity", None, None))
                continue
        if isinstance(d, E.Wait):
            waits.append(_WaitRow(row, d.reason, status.kind, status.position, status.queue_length))
            summary.waiting.append(row.pk)
            continue
        job = models_.get(row.pk)
        if job is None:  # deleted since the snapshot
            summary.conflicts.append(row.pk)
            continue
        if isinstance(d, E.Admit):
            admits.append((job, d.placement, status))
        elif isinstance(d, E.Preempt):
            preemptions.append((job, d))
        elif isinstance(d, E.Reject) and policy.reject_or_unplace(
                floating=job.floating, cycle_of_a_cluster=inputs.cluster is not None) == "unplace":
            # Under this cycle's lock.
            assert inputs.cluster is not None
            from .placement import job_unplace  # placement imports this module

            if job_unplace(job_id=job.pk, reason=f"cluster {inputs.cluster} cannot run it: {d.reason}",
                           refused=d.reason, refused_fp=(_refusal_fp(inputs, status, job, memo), status.kind),
                           locked=True, from_cluster=inputs.cluster.pk):
                summary.waiting.append(job.pk)
            else:
                summary.conflicts.append(job.pk)
        elif isinstance(d, E.Reject):
            if transition(job, "reject", reason=d.reason, fields={"reason_kind": status.kind},
                          where={"cluster": inputs.cluster or job.cluster}, audit={"reason": d.reason}):
                summary.rejected.append(job.pk)
    locked = _lock_rows(inputs, admits, preemptions, models_)
    preemptions, refused = _guaranteed_preemptions(admits, preemptions, models_)
    for job, reason in refused:
        summary.waiting.append(job.pk)
        waits.append(_WaitRow(job, reason, "guarantee", None, None))
    for job in _preempt_all(inputs, models_, preemptions, summary, locked):
        waits.append(_WaitRow(job, CONFLICT_REASON, "capacity", None, None))
    for job, reason, kind in _admit_all(inputs, admits, summary, locked):
        waits.append(_WaitRow(job, reason, kind, None, None))
    _wait_all(waits)


def _refusal_fp(inputs: selectors.CycleInputs, status: JobStatus, job: Job, memo: dict[str, Any]) -> str:
    """The fingerprint recorded with a refusal (``placement.refusal_fingerprint``) from this
    cycle's own snapshot; the cluster's digest and the pending jobs by name computed once."""
    from .placement import quota_stamp, quota_times, refusal_fingerprint

    assert inputs.cluster is not None
    if not memo:
        memo["capacity"] = M.capacity_key(inputs.snapshot.nodes, inputs.cluster.placement_policy)
        memo["pending"] = {j.name: j for j in (*inputs.pending, *inputs.held_out)}
        # Read with the snapshot (``_decide``): a quota changed since is not the one judged.
        times = inputs.quota_times
        memo["times"] = times if times is not None else quota_times([inputs.cluster.pk])
    key = (inputs.cluster.pk, job.tenant_id, job.project_id)
    return refusal_fingerprint(memo["capacity"], memo["pending"][status.job], *key,
                               stamps={key: quota_stamp(memo["times"], key)}, kind=status.kind)


@dataclass(frozen=True, slots=True)
class _Locked:
    """What ``_lock_rows`` read under lock: job id → (state, attempts); GPU id → its
    current totals (``GpuRow.totals()`` order); the GPUs whose totals moved since the
    snapshot."""
    jobs: dict[int, tuple[str, int]]
    gpus: dict[int, tuple[Any, ...]]
    moved: set[int]


def _placement_gpus(inputs: selectors.CycleInputs, placement: E.Placement) -> set[int]:
    return {inputs.gpus[(pp.node, g.index)].pk for pp in placement.pods for g in pp.gpus}


def _lock_rows(inputs: selectors.CycleInputs, admits: list[tuple[Job, E.Placement, JobStatus]],
               preemptions: list[tuple[Job, E.Preempt]], jobs: dict[int, Job]) -> _Locked:
    """Lock, once for the whole write, the rows the admissions and preemptions are checked
    against: first the jobs (admitted, preemptors, victims), then the GPUs their placements
    use, each in ascending id order — jobs before GPUs, as a release locks its job and then
    updates its GPUs, so a cycle and a release never wait on each other in a circle. FOR NO
    KEY UPDATE (see the note on row locks above). Two statements however many jobs."""
    pks = {job.pk for job, _, _ in admits} | {job.pk for job, _ in preemptions}
    pks.update(int(v) for _, d in preemptions for v in d.victims if int(v) in jobs)
    used: set[int] = set()
    for _, placement, _ in admits:
        used |= _placement_gpus(inputs, placement)
    for _, d in preemptions:
        used |= _placement_gpus(inputs, d.placement)
    locked_jobs: dict[int, tuple[str, int]] = {}
    if pks:
        rows = Job.objects.select_for_update(no_key=True).filter(pk__in=sorted(pks)).order_by("pk")
        # A job counts only while it is still this cluster's: a floating job sent back to the
        # global queue (and perhaps bound elsewhere) since the snapshot is neither admitted
        # nor a preemptor here — as if it had been cancelled meanwhile.
        locked_jobs = {pk: (state, attempts) for pk, state, attempts, cluster_id
                       in rows.values_list("pk", "state", "attempts", "cluster_id")
                       if inputs.cluster is None or cluster_id == inputs.cluster.pk}
    current: dict[int, tuple[Any, ...]] = {}
    if used:
        current = {row[0]: row[1:] for row in GpuDevice.objects.select_for_update(no_key=True).filter(
            pk__in=sorted(used)).order_by("pk").values_list(
            "pk", "memory_allocated_mib", "cores_allocated", "sharers", "exclusive_held", "memory_mib",
            "max_sharers", "foreign_memory_mib", "foreign_cores", "foreign_sharers", "foreign_exclusive")}
    by_pk = {gpu.pk: gpu for gpu in inputs.gpus.values() if gpu.pk in used}
    # Moved also when an inventory sync changed what other schedulers' pods hold there.
    moved = {pk for pk in used if current.get(pk) != by_pk[pk].totals()}
    return _Locked(locked_jobs, current, moved)


def _outside_pools(inputs: selectors.CycleInputs, tenant_id: int, placement: E.Placement) -> str:
    """Step 1 of the write's policy (``write_policy.outside_pools``) on this cycle's inputs."""
    return policy.outside_pools(inputs.pools, tenant_id, placement)


@dataclass(frozen=True, slots=True)
class _WaitRow:
    job: Job | selectors.JobRow
    reason: str
    kind: str
    position: int | None
    length: int | None


def _wait(job: Job, reason: str, kind: str, position: int | None, length: int | None) -> None:
    _wait_all([_WaitRow(job, reason, kind, position, length)])


def _wait_all(rows: list[_WaitRow]) -> None:
    """Record why jobs wait and where they stand. A job whose reason, kind, position and
    queue length are unchanged costs nothing; the changed ones are one bulk update (guarded:
    only jobs still QUEUED), and the history keeps one row per change of *why*, not per
    change of position."""
    changed: dict[int, tuple[_WaitRow, str]] = {}
    for r in rows:
        reason = r.reason[:500]
        if (r.job.reason, r.job.reason_kind, r.job.queue_position, r.job.queue_length) == (
                reason, r.kind, r.position, r.length):
            continue
        changed[r.job.pk] = (r, reason)  # a later row for the same job wins, as it did row by row
    if not changed:
        return
    updated = _update_from_values(
        Job, [("reason", "varchar"), ("reason_kind", "varchar"), ("queue_position", "integer"),
              ("queue_length", "integer")],
        [(pk, reason, r.kind, r.position, r.length) for pk, (r, reason) in changed.items()],
        where=("state", JobState.QUEUED.value),
    )
    history: list[dict[str, Any]] = []
    for pk in sorted(updated):
        r, reason = changed[pk]
        if r.job.reason.split(" — ")[0] != reason.split(" — ")[0] or r.job.reason_kind != r.kind:
            history.append({"job_id": pk, "cluster_id": r.job.cluster_id,
                            "kind": DecisionKind.WAITING.value, "reason": reason,
                            "queue_position": r.position})
        r.job.reason, r.job.reason_kind = reason, r.kind
        r.job.queue_position, r.job.queue_length = r.position, r.length
    _record_rows(history)


def _placement_json(placement: E.Placement) -> list[dict[str, Any]]:
    return [
        {"pod": pp.pod, "node": pp.node, "cpu_millicores": pp.cpu_millicores, "ram_mib": pp.ram_mib,
         "gpus": [{"index": g.index, "uuid": g.uuid, "model": selectors.plain_model(g.gpu_model),
                   "memory_mib": g.gpu_memory_mib, "cores_percent": g.gpu_cores_percent,
                   "exclusive": g.exclusive, "container": g.container} for g in pp.gpus]}
        for pp in placement.pods
    ]


def _admit_all(inputs: selectors.CycleInputs, admits: list[tuple[Job, E.Placement, JobStatus]],
               summary: CycleSummary, locked: _Locked) -> list[tuple[Job, str, str]]:
    """Persist the cycle's admissions in bulk; returns the jobs that must wait instead
    (with why and the reason's kind) because their placement was taken since the snapshot
    or they would cross a GPU limit across all clusters (``_within_all_clusters``).

    Optimistic, job by job in the engine's order: the admitted jobs' rows and the GPUs they
    use are locked (``_lock_rows``: ids in ascending order, as everywhere: no deadlock between
    cycles and releases); a job no longer QUEUED (cancelled meanwhile) is skipped; a job using a GPU
    whose totals moved since the snapshot, or that would overfill one (the CHECK
    constraints' rules), waits; the others are written with one statement per table, still
    guarded by the constraints. Should the database refuse the bulk write anyway, each job
    is admitted on its own, by the same write in its own savepoint (the one the database
    refuses waits)."""
    if not admits:
        return []
    queued = {pk: attempts for pk, (state, attempts) in locked.jobs.items() if state == JobState.QUEUED}
    current, moved = locked.gpus, locked.moved
    totals = {pk: list(row[:4]) for pk, row in current.items()}
    accepted: list[tuple[Job, E.Placement, JobStatus]] = []
    taken: list[tuple[Job, str, str]] = []
    for job, placement, status in admits:
        if job.pk not in queued:
            summary.conflicts.append(job.pk)  # cancelled meanwhile
            continue
        delta = _gpu_delta(inputs, placement)
        if any(pk in moved or not _fits(current[pk], totals[pk], d) for pk, d in delta.items()):
            # Moved: released or taken since the snapshot. Overfilled: the engine counted
            # on room the database does not have yet (a preemption victim still holds it).
            logger.warning("admission of job %s: its GPUs moved or are still held; it waits", job.pk)
            summary.conflicts.append(job.pk)
            taken.append((job, CONFLICT_REASON, "capacity"))
            continue
        for pk, d in delta.items():
            t = totals[pk]
            t[0], t[1], t[2], t[3] = t[0] + d[0], t[1] + d[1], t[2] + d[2], t[3] or bool(d[3])
        accepted.append((job, placement, status))
    accepted, over = _within_all_clusters(accepted)
    for job, reason, kind in over:
        summary.waiting.append(job.pk)
        taken.append((job, reason, kind))
    try:
        with transaction.atomic():
            _write_admissions(inputs, accepted, queued, _totals(inputs, current, accepted))
    except IntegrityError:
        # The same write, one job per savepoint: the job the database refuses waits.
        logger.warning("bulk admission refused by the database; admitting job by job")
        done: list[tuple[Job, E.Placement, JobStatus]] = []
        for one in accepted:
            try:
                with transaction.atomic():
                    _write_admissions(inputs, [one], queued, _totals(inputs, current, [*done, one], one))
            except IntegrityError:
                logger.warning("admission of job %s refused by the database; it stays queued", one[0].pk)
                summary.conflicts.append(one[0].pk)
                taken.append((one[0], CONFLICT_REASON, "capacity"))
                continue
            done.append(one)
            summary.admitted.append(one[0].pk)
        return taken
    summary.admitted.extend(job.pk for job, _, _ in accepted)
    return taken


def _totals(inputs: selectors.CycleInputs, current: dict[int, tuple[Any, ...]],
            admitted: list[tuple[Job, E.Placement, JobStatus]],
            only: tuple[Job, E.Placement, JobStatus] | None = None) -> dict[int, list[Any]]:
    """GPU id → its totals (``GpuRow.totals()`` order, first four) once ``admitted`` hold their
    slices, from the rows read under lock (``current``): for the GPUs ``admitted`` use (or,
    given ``only``, that one admission uses), ids ascending. Jobs that were judged and then
    held back (a quota across all clusters) add nothing."""
    totals: dict[int, list[Any]] = {}
    for _, placement, _ in admitted:
        for pk, d in _gpu_delta(inputs, placement).items():
            t = totals.setdefault(pk, list(current[pk][:4]))
            t[0], t[1], t[2], t[3] = t[0] + d[0], t[1] + d[1], t[2] + d[2], t[3] or bool(d[3])
    keep = set(_gpu_delta(inputs, only[1])) if only is not None else set(totals)
    return {pk: totals[pk] for pk in sorted(keep)}


def _lock_all_clusters(tenant_ids: Iterable[int]) -> None:
    """The per-tenant advisory locks of the quotas across all clusters (ascending ids, so two
    cycles never wait on each other in a circle; released at commit). Taken again by the same
    transaction, a lock is already held: no wait."""
    xact_locks(_ALL_CLUSTERS_LOCK_CLASS, tenant_ids)


def _guaranteed_preemptions(admits: list[tuple[Job, E.Placement, JobStatus]],
                            preemptions: list[tuple[Job, E.Preempt]], jobs: dict[int, Job],
                            ) -> tuple[list[tuple[Job, E.Preempt]], list[tuple[Job, str]]]:
    """Reclaim preemptions that rely on a guarantee across all clusters, re-checked under the
    per-tenant lock (``all_clusters.guarantee_refusal``): one whose owner's guarantee is held
    or being reclaimed on other clusters meanwhile evicts nobody and waits, with why. The lock
    covers the admissions' tenants too (taken once, ascending), for ``_within_all_clusters``.
    A preemption whose victims all have a lower priority does not rely on a guarantee."""
    if not preemptions:
        return preemptions, []
    limits = selectors.all_cluster_limits({job.tenant_id for job, _ in preemptions}
                                          | {job.tenant_id for job, _, _ in admits})
    if not (limits.project_guarantee or limits.tenant_guarantee):
        return preemptions, []
    _lock_all_clusters(limits.tenant_ids)
    use = selectors.all_cluster_use(limits.tenant_ids)
    book = selectors.guarantee_book(limits)
    if book is None:
        return preemptions, []
    return policy.guaranteed_preemptions(preemptions, jobs, limits, use, book)


def _within_all_clusters(accepted: list[tuple[Job, E.Placement, JobStatus]],
                         ) -> tuple[list[tuple[Job, E.Placement, JobStatus]], list[tuple[Job, str, str]]]:
    """Hold quotas across all clusters under racing cycles. Inside the write transaction,
    before the admission rows are written: a transaction-level advisory lock per tenant that
    has such a quota (its own or a project's; ascending ids, so two cycles never wait on each
    other in a circle; released at commit, when this cycle's allocations are visible), then
    what its jobs hold on every cluster counted again (READ COMMITTED: the other clusters'
    committed admissions included): the GPU limit and the GPU memory limits per model class
    (``all_clusters.admissible``; kind ``quota``), and for non-preemptible jobs the GPU
    guarantee across all clusters (``all_clusters.guarantee_refusal``; kind ``guarantee``). A
    job that would cross one waits, with the quota named; the rest of the cycle goes through."""
    if not accepted:
        return accepted, []
    limits = selectors.all_cluster_limits({job.tenant_id for job, _, _ in accepted})
    if not limits:
        return accepted, []
    _lock_all_clusters(limits.tenant_ids)
    use = selectors.all_cluster_use(limits.tenant_ids)
    return policy.within_all_clusters(accepted, limits, use, selectors.guarantee_book(limits))


def _gpu_delta(inputs: selectors.CycleInputs, placement: E.Placement) -> dict[int, list[int]]:
    """GPU id → [memory MiB, cores %, slices, exclusive] that ``placement`` adds."""
    delta: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for pp in placement.pods:
        for g in pp.gpus:
            d = delta[inputs.gpus[(pp.node, g.index)].pk]
            d[0] += g.gpu_memory_mib
            d[1] += g.gpu_cores_percent
            d[2] += 1
            d[3] = d[3] or int(g.exclusive)
    return delta


def _fits(row: tuple[Any, ...], total: list[Any], d: list[int]) -> bool:
    """Whether adding ``d`` to a GPU's ``total`` keeps the CHECK constraints of GpuDevice
    (``row`` holds its memory_mib and max_sharers at indices 4 and 5)."""
    sharers = total[2] + d[2]
    return (total[0] + d[0] <= row[4] and total[1] + d[1] <= 100 and sharers <= row[5]
            and not ((total[3] or d[3]) and sharers > 1))


def _write_admissions(inputs: selectors.CycleInputs, accepted: list[tuple[Job, E.Placement, JobStatus]],
                      attempts: dict[int, int], totals: dict[int, list[Any]]) -> None:
    """Jobs STARTING, their Allocation and GpuSlice rows, the GPUs' new totals: one
    statement per table. (Rows locked by the caller: ``attempts`` are current.)"""
    now = timezone.now()
    # Each job records its project's namespace at admission: the namespaces already assigned
    # in one query, the others assigned now (first admission of a project on this cluster).
    namespaces: dict[int, str] = {}
    if accepted:
        cluster = inputs.cluster or accepted[0][0].cluster
        namespaces = dict(ProjectNamespace.objects.filter(
            cluster=cluster, project_id__in={job.project_id for job, _, _ in accepted})
            .values_list("project_id", "name"))
    for job, _, _ in accepted:
        if job.project_id not in namespaces and job.kind != EXTERNAL_KIND:
            namespaces[job.project_id] = project_namespace_ensure(
                cluster=inputs.cluster or job.placed_cluster, project=job.project)
    # External jobs (issue 34): their pods exist already, in the namespace bound to the project.
    external = {(e.job_id, e.replica): e.name for e in ExternalPod.objects.filter(
        job_id__in=[job.pk for job, _, _ in accepted if job.kind == EXTERNAL_KIND])}
    pods: list[dict[str, Any]] = []
    placed: list[E.PodPlacement] = []
    for job, placement, _ in accepted:
        groups = inputs.groups[job.pk]
        for pp in placement.pods:
            group_name, replica = pp.pod[len(f"{job.pk}-"):].rsplit("-", 1)
            pods.append({
                "cluster_id": job.placed_cluster_id, "job_id": job.pk, "group_id": groups[group_name],
                "replica": int(replica),
                "pod_name": external.get((job.pk, int(replica))) or pod_name(job.name, job.pk, group_name,
                                                                             int(replica)),
                "node_id": inputs.nodes[pp.node], "cpu_millicores": pp.cpu_millicores, "ram_mib": pp.ram_mib})
            placed.append(pp)
    ids = _insert_allocations(pods)
    slices = [{"allocation_id": ids[(pod["job_id"], pod["group_id"], pod["replica"])],
               "gpu_id": inputs.gpus[(pp.node, g.index)].pk, "container": g.container,
               "memory_mib": g.gpu_memory_mib, "cores_percent": g.gpu_cores_percent, "exclusive": g.exclusive}
              for pod, pp in zip(pods, placed, strict=True) for g in pp.gpus]
    if connection.vendor == "postgresql":
        _insert_rows(GpuSlice, slices)
    else:
        GpuSlice.objects.bulk_create([GpuSlice(**row) for row in slices], batch_size=2000)
    # Refuses (IntegrityError) rather than over-allocate: the CHECK constraints.
    _update_from_values(GpuDevice, [("memory_allocated_mib", "integer"), ("cores_allocated", "integer"),
                                    ("sharers", "integer"), ("exclusive_held", "boolean")],
                        [(pk, *t) for pk, t in totals.items()])
    # The jobs' transition last, when nothing can roll the savepoint back any more (their audit
    # events are buffered to the transaction's end: ``audit_batch``). Admission times follow
    # the engine's order (a microsecond apart), as they did when jobs were admitted one by
    # one: preemption picks the most recently started victims first.
    moves = []
    for i, (job, placement, status) in enumerate(accepted):
        pj = _placement_json(placement)
        moves.append(Move(job, ADMITTED_REASON, (now + dt.timedelta(microseconds=i), status.kind,
                                                 attempts[job.pk] + 1,
                                                 job.namespace if job.kind == EXTERNAL_KIND
                                                 else namespaces[job.project_id]),
            said=_admit_reason(placement), decision={"placement": pj},
            audit={"placement": pj, "borrowing": status.borrowing}))
    done = transition_many("admit", moves, columns=[
        ("admitted_at", "timestamptz"), ("reason_kind", "varchar"), ("attempts", "integer"),
        ("namespace", "varchar")])
    if len(done) != len(moves):  # cannot happen under the rows' locks; never slices without a job
        raise IntegrityError("a job left QUEUED under its row lock")


def _insert_allocations(pods: list[dict[str, Any]]) -> dict[tuple[int, int, int], int]:
    """Insert the Allocation rows ``pods`` (column → value); returns (job, group, replica) → id
    (a pod's unique key). One statement on PostgreSQL (``_insert_rows``), ``bulk_create`` on the
    demo's SQLite."""
    if connection.vendor == "postgresql":
        return {(job, group, replica): pk for pk, job, group, replica in _insert_rows(
            Allocation, pods, returning=("id", "job_id", "group_id", "replica"))}
    made = Allocation.objects.bulk_create([Allocation(**pod) for pod in pods], batch_size=2000)
    return {(a.job_id, a.group_id, a.replica): a.pk for a in made}


def _admit_reason(placement: E.Placement) -> str:
    nodes = sorted(set(placement.nodes()))
    gpus = sum(len(pp.gpus) for pp in placement.pods)
    return f"Admitted: {len(placement.pods)} pod(s) on {', '.join(nodes)} with {gpus} GPU slice(s)"


def _preemptions_still_valid(inputs: selectors.CycleInputs, preemptions: list[tuple[Job, E.Preempt]],
                             summary: CycleSummary, locked: _Locked,
                             ) -> tuple[list[tuple[Job, E.Preempt]], list[Job]]:
    """``(going, taken)``: the preemptions whose preemptor is still QUEUED and whose GPUs have
    not moved since the snapshot, and the preemptors that must wait because they moved."""
    taken: list[Job] = []
    going: list[tuple[Job, E.Preempt]] = []
    for job, d in preemptions:
        if locked.jobs.get(job.pk, ("", 0))[0] != JobState.QUEUED:
            summary.conflicts.append(job.pk)  # cancelled meanwhile
        elif _placement_gpus(inputs, d.placement) & locked.moved:
            logger.warning("preemption by job %s: its GPUs moved since the snapshot; it waits", job.pk)
            summary.conflicts.append(job.pk)
            taken.append(job)
        else:
            going.append((job, d))
    return going, taken


def _preempt_all(inputs: selectors.CycleInputs, jobs: dict[int, Job],
                 preemptions: list[tuple[Job, E.Preempt]], summary: CycleSummary,
                 locked: _Locked) -> list[Job]:
    """Mark the victims PREEMPTING (their pods are deleted after commit); each preemptor
    waits, out of the queue, until its victims' resources are actually released. Reasons and
    audit events name jobs of other projects / tenants only by count (``_preempted_reason``);
    the decision rows keep the ids, shown only to those who may see those jobs.

    In bulk (issue 13: at ~90 % allocation a cycle starts hundreds of preemptions, and job by
    job that was about five statements a victim): one guarded update of the victims (only
    jobs still STARTING or RUNNING: a victim that finished meanwhile is not preempted, and a
    victim is claimed by the first preemptor that names it, as row by row), one of the
    preemptors (only jobs still QUEUED), their history rows in one insert, one stop task.

    Checked first, like admissions, against the rows ``_lock_rows`` locked: a preemptor no
    longer QUEUED (cancelled meanwhile) is skipped, and one whose planned GPUs' totals moved
    since the snapshot (taken by another job, or by another scheduler's pods) evicts nobody
    and is returned, to wait ("placement taken concurrently"): its victims are not killed
    for room it could not use."""
    preemptions, taken = _preemptions_still_valid(inputs, preemptions, summary, locked)
    if not preemptions:
        return taken
    claimed: dict[int, tuple[Job, Job, str]] = {}
    for job, d in preemptions:
        for v in d.victims:
            victim = jobs.get(int(v))
            if victim is not None and victim.pk not in claimed:  # None: gone since the snapshot
                claimed[victim.pk] = (victim, job, _preempted_reason(victim, job))
    updated = transition_many("preempt", [Move(
        victim, reason, (job.pk,), decision={"preemptor_id": job.pk}, audit={
            "preemptor": job.pk if job.tenant_id == victim.tenant_id else None, "reason": reason,
            "checkpoint_capable": victim.checkpoint_capable})
        for victim, job, reason in claimed.values()], columns=[("preempted_by_id", "bigint")])
    history: list[SchedulingDecision] = []
    evicted: dict[int, list[Job]] = defaultdict(list)
    for pk, (victim, job, _) in claimed.items():
        if pk in updated:
            evicted[job.pk].append(victim)
    waiting: list[tuple[int, str, str, None, None]] = []
    for job, d in preemptions:
        mine = evicted.get(job.pk, [])
        named = [f"#{v.pk}" for v in mine if v.project_id == job.project_id]
        elsewhere = len(mine) - len(named)
        listed = ", ".join(named + ([f"{elsewhere} of other projects or tenants"] if elsewhere else []))
        reason = f"Preempting {len(mine)} job(s) ({listed}); starts once their resources are released"
        waiting.append((job.pk, reason, "preempting", None, None))
        history.append(SchedulingDecision(job_id=job.pk, cluster_id=job.cluster_id,
                                          kind=DecisionKind.PREEMPTING, reason=reason[:500],
                                          victims=[v.pk for v in mine],
                                          placement=_placement_json(d.placement)))
        _audit_job("job.preempting", job, after={
            "victims": [v.pk for v in mine if v.tenant_id == job.tenant_id],
            "victims_of_other_tenants": sum(v.tenant_id != job.tenant_id for v in mine)})
        summary.preempting.append(job.pk)
        summary.victims.extend(v.pk for v in mine)
    _update_from_values(
        Job, [("reason", "varchar"), ("reason_kind", "varchar"), ("queue_position", "integer"),
              ("queue_length", "integer")], waiting, where=("state", JobState.QUEUED.value))
    _record_all(history)
    return taken
