"""One pool across clusters: the global queue and the placement step (issue 16).

A floating job (submitted for any cluster, a set of clusters, or cluster labels) is queued
with no cluster (``Job.cluster`` NULL). ``placement_run`` takes the global queue in its
order and, for each job, asks every cluster it may use how soon the job would start there
(the pure rules: scheduling/engine/multicluster.py), then binds it to the best one. The
per-cluster cycle (services ``cycle_run``) and its advisory lock are unchanged: a bound job
is one of that cluster's queued jobs like any other.

Safety: binding is one conditional UPDATE (``cluster IS NULL`` → the chosen cluster, or the
old cluster → a better one while the job is still queued), taken while holding the target
cluster's cycle lock (and, for a move, the old one's), so a cycle never admits a job that
is being moved and a job is never bound to two clusters. A bound floating job goes back to
the global queue (``job_unplace``) when its dispatch fails there or when its cluster
becomes unreachable; the cluster where its dispatch failed is avoided for a while.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, F, Q, Sum
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone

from scheduling import engine as E
from scheduling.engine import multicluster as M
from scheduling.engine.model import ARCH_LABEL
from scheduling.engine.placement import model_family
from tenants.audit import audit_batch, audit_record
from tenants.models import Quota, QuotaScope

from .. import selectors
from ..models import (
    CHOICE_KEYS,
    Cluster,
    DecisionKind,
    GpuDevice,
    Job,
    JobState,
    Node,
    PodGroup,
    SchedulingDecision,
    redact,
    without_cluster_bulk,
)
from .common import _record_all, _send_after_commit, request_cycle, session_try_lock
from .cycle import _consistent_read, _update_from_values, cycle_lock, engine_policy
from .lifecycle import transition

logger = logging.getLogger(__name__)

SCHEDULER = "scheduler"
_PLACEMENT_LOCK_CLASS = 0x43414D47  # "CAMG": the global queue's placement step (one at a time)
AVOID_SECONDS = 600
"""A cluster where a floating job's dispatch failed is not chosen again for this long."""
PLACEMENT_BATCH = 500
"""Floating jobs looked at per batch of a placement step (the global queue's head first)."""
PLACEMENT_FRESH_S = 60.0
"""A job bound this recently that its cluster's cycle has not looked at yet (its reason is
still the placement's) and that still fits now there is not probed on the other clusters
again while every cluster is open (``M.Pending.fresh``): nothing beats fits now, and at a
burst the queue's head is mostly such jobs, each costing a probe per cluster per step
(BENCHMARKS §14). Its ``placement_note`` (why not each other cluster) is then up to this old;
a cluster closing or becoming unreachable is said at the next step."""
PLACEMENT_BUDGET_S = 2.0
"""A placement step goes on with the next batch while its batches have spent less wall time
than this, or than reading the clusters took if that was longer (and its last batch was
full): ~2 s a batch of 500 on the 2-core bench machine (BENCHMARKS §11, §14b), so a few
batches at most; 0: one batch a step. Each batch commits on its own, so a cycle waits for
its lock one batch at most."""


# --- requests ------------------------------------------------------------------------------


def request_placement(*, countdown: float | None = None) -> None:
    """Ask for one placement step after commit (requests coalesce, as ``request_cycle``)."""
    try:
        if not cache.add("camp:placement-queued", 1, timeout=max(5, 2 * settings.SCHEDULER_TICK_SECONDS)):
            return
    except Exception:  # the cache is down: the beat's tick asks again
        logger.warning("placement request not queued (cache unavailable)")
        return
    _send_after_commit("placement_step", countdown=countdown)


def placement_request_taken() -> None:
    cache.delete("camp:placement-queued")


@contextlib.contextmanager
def _placement_lock() -> Iterator[bool]:
    if connection.vendor != "postgresql":
        yield True  # SQLite (the demo): one worker process
        return
    with session_try_lock(_PLACEMENT_LOCK_CLASS, 0) as got:
        yield got


# --- what each cluster offers ----------------------------------------------------------------


def cluster_closed_reason(cluster: Cluster) -> str:
    if not cluster.enabled:
        return "disabled"
    if cluster.unreachable_since is not None:
        since = cluster.unreachable_since.strftime("%H:%M UTC")
        return f"unreachable since {since}; it takes no new work"
    return ""


def cluster_views(clusters: list[Cluster]) -> dict[int, M.ClusterView]:
    """Each cluster's labels, health, node architectures and GPU models (two grouped queries)."""
    return _cluster_facts(clusters)[0]


def _cluster_facts(clusters: list[Cluster]) -> tuple[dict[int, M.ClusterView], set[int]]:
    """``cluster_views`` and the ids of the clusters with a node synced (present).

    The database groups the rows: one per (cluster, architecture) and one per (cluster, GPU
    model), not one per node and per GPU (the openb cluster's 1,213 nodes and 6,212 GPUs were
    read and decoded on every pinned submit: ~20 ms of CPU, issue 35)."""
    arches: dict[int, set[str]] = defaultdict(set)
    nodes = (Node.objects.filter(cluster__in=clusters, present=True)
             .annotate(arch=KeyTextTransform(ARCH_LABEL, "labels"))
             .values_list("cluster_id", "arch").distinct().order_by())
    for cid, arch in nodes:
        arches[cid].add("amd64" if arch is None else str(arch))
    models: dict[int, set[str]] = defaultdict(set)
    capacity: dict[int, int] = defaultdict(int)
    gpus = (GpuDevice.objects.filter(node__cluster__in=clusters, node__present=True)
            .values_list("node__cluster_id", "model").annotate(n=Count("pk")).order_by())
    for cid, model, n in gpus:
        models[cid].add(model_family(model))
        capacity[cid] += n
    synced = set(arches)  # before the defaultdicts below gain a key for every cluster
    views = {c.pk: M.ClusterView(
        name=c.name, labels={str(k): str(v) for k, v in (c.labels or {}).items()},
        reachable=c.unreachable_since is None, closed_reason=cluster_closed_reason(c),
        arches=frozenset(arches[c.pk]) or frozenset({"amd64"}), gpu_models=frozenset(models[c.pk]),
        gpu_capacity=float(capacity[c.pk])) for c in clusters}
    return views, synced


def _needs(job: E.Job) -> M.JobNeeds:
    arches: frozenset[str] = frozenset()
    models: set[str] = set()
    for g in job.groups:
        if g.template.arches:
            arches = g.template.arches if not arches else arches & g.template.arches
        models.update(model_family(m) for m in g.template.gpu_models)
    return M.JobNeeds(arches=arches, gpu_models=frozenset(models), gpus=M.job_gpus(job))


def quota_times(cluster_ids: Collection[int], tenant_ids: Collection[int] | None = None,
                project_ids: Collection[int] | None = None) -> dict[tuple[str, int], str]:
    """(scope, owner id) → when that quota row last changed, in one query: the quotas of
    these clusters and of these tenants and projects (None: all of them)."""
    tq = Q(scope=QuotaScope.TENANT)
    if tenant_ids is not None:
        tq &= Q(tenant_id__in=tenant_ids)
    pq = Q(scope=QuotaScope.PROJECT)
    if project_ids is not None:
        pq &= Q(project_id__in=project_ids)
    rows = Quota.objects.filter(Q(scope=QuotaScope.CLUSTER, cluster_id__in=cluster_ids) | tq | pq
                                ).values_list("scope", "cluster_id", "tenant_id", "project_id", "updated_at")
    at: dict[tuple[str, int], str] = {}
    for scope, cid, tid, pid, updated in rows:
        owner = cid if scope == QuotaScope.CLUSTER else tid if scope == QuotaScope.TENANT else pid
        at[(str(scope), owner)] = updated.isoformat()
    return at


def quota_stamp(times: dict[tuple[str, int], str], key: tuple[int, int, int]) -> str:
    """The stamp of the quota rows on the path (cluster, tenant, project): when each last
    changed, "-" for none. A refusal over a limit or a guarantee lapses when one changes."""
    path = ((QuotaScope.CLUSTER.value, key[0]), (QuotaScope.TENANT.value, key[1]),
            (QuotaScope.PROJECT.value, key[2]))
    return "|".join(times.get(x, "-") for x in path)


def quota_stamps(keys: Iterable[tuple[int, int, int]]) -> dict[tuple[int, int, int], str]:
    """``quota_stamp`` of each (cluster id, tenant id, project id), in one query."""
    keys = set(keys)
    if not keys:
        return {}
    times = quota_times({k[0] for k in keys}, {k[1] for k in keys}, {k[2] for k in keys})
    return {k: quota_stamp(times, k) for k in keys}


def refusal_fingerprint(capacity: str, ejob: E.Job, cluster_id: int, tenant_id: int, project_id: int,
                        stamps: dict[tuple[int, int, int], str] | None = None, kind: str = "") -> str:
    """The fingerprint recorded with a refusal and compared by the placement step
    (``M.refusal_fingerprint``): the cluster's ``M.capacity_key``, the job as that cluster
    sees it, and its quota stamp, by the refusal's kind."""
    key = (cluster_id, tenant_id, project_id)
    stamp = (stamps if stamps is not None else quota_stamps([key]))[key]
    return M.refusal_fingerprint(capacity, ejob, stamp, kind)


def _kind(entry: object) -> str:
    return str(entry.get("kind", "")) if isinstance(entry, dict) else ""


def _refused_since(entry: object) -> str:
    if isinstance(entry, dict):
        with contextlib.suppress(ValueError, TypeError):
            at = dt.datetime.fromisoformat(str(entry.get("at"))).strftime("%H:%M UTC")
            return f" (found by its cycle at {at}{_AGAIN})"
    return ""


def _live_refusals(jobs: list[Job], trials: list[_Trial], wall: dt.datetime) -> dict[int, dict[str, str]]:
    """Job id → the clusters still refused to it, with why (``M.live_refusals``): a refusal
    lapses when the cluster's nodes, the quotas on the job's path there or the job's view of
    the cluster (dedicated pools) changed since, or after ``M.REFUSAL_MAX_AGE_S``. One quota
    query per step, and one digest per refused open cluster, only when some job has one."""
    todo = [j for j in jobs if (j.cluster_choice or {}).get("refused")]
    if not todo:
        return {}
    open_ = {tr.cluster.name: tr for tr in trials if not tr.trial.view.closed_reason}
    named = {str(n) for j in todo for n in j.cluster_choice["refused"]} & set(open_)
    capacity = {n: M.capacity_key(open_[n].trial.placer.state.snapshot.nodes,
                                  open_[n].cluster.placement_policy) for n in named}
    stamps = quota_stamps((open_[n].cluster.pk, j.tenant_id, j.project_id)
                          for j in todo for n in j.cluster_choice["refused"] if n in named)
    out: dict[int, dict[str, str]] = {}
    for j in todo:
        entries = j.cluster_choice["refused"]
        current = {n: refusal_fingerprint(capacity[n], open_[n].jobs[j.pk], open_[n].cluster.pk,
                                          j.tenant_id, j.project_id, stamps, _kind(entries[n]))
                   for n in entries if n in named and j.pk in open_[n].jobs}
        out[j.pk] = {n: f"{why}{_refused_since(entries[n])}"
                     for n, why in M.live_refusals(entries, current, wall, j.updated_at).items()}
    return out


def _avoided(choice: dict[str, Any], now: dt.datetime) -> dict[str, str]:
    """Clusters where the job's dispatch failed lately: ``failed`` holds, per cluster name,
    [when, message, failures there]."""
    out = {}
    for name, entry in (choice.get("failed") or {}).items():
        with contextlib.suppress(ValueError, TypeError, IndexError):
            at, msg = entry[0], entry[1]
            if (now - dt.datetime.fromisoformat(at)).total_seconds() < AVOID_SECONDS:
                out[name] = redact(f"its pods could not be created there: {msg}", 340)  # users read it
    return out


def dispatch_failures(choice: dict[str, Any] | None, cluster: str) -> int:
    """How many times a floating job's dispatch failed on ``cluster`` (its attempts there)."""
    entry = ((choice or {}).get("failed") or {}).get(cluster)
    try:
        return int(entry[2]) if entry else 0
    except (IndexError, TypeError, ValueError):
        return 1


@dataclass
class _Trial:
    cluster: Cluster
    trial: M.ClusterTrial
    jobs: dict[int, E.Job]
    """Floating job id → the job as this cluster's engine sees it (its dedicated pools)."""
    access: selectors.PoolAccess = selectors.NO_POOLS
    """Its dedicated pools (``_more_jobs`` reads a step's next batch as this cluster sees it)."""


def _trials(clusters: list[Cluster], views: dict[int, M.ClusterView], ids: list[int], now: float
            ) -> list[_Trial]:
    """One trial per open cluster: its snapshot, running jobs and the floating jobs as its
    engine would see them (read in one consistent snapshot per cluster)."""
    out = []
    room = selectors.all_cluster_room_by_name()
    for c in clusters:
        if views[c.pk].closed_reason:
            empty = E.Placer(E.ClusterState(E.ClusterSnapshot(nodes=())), E.default_policy(None))
            out.append(_Trial(c, M.ClusterTrial(views[c.pk], empty, (), now), {}))
            continue
        with _consistent_read():
            enodes, nodes, gpus, gpu_by_id, access = selectors._cluster_part(c)
            rows: dict[str, selectors.JobRow] = {}
            eallocs, ckpt, estimates = selectors._running_part(c, nodes, gpu_by_id, access, rows)
            pending, _ = selectors._pending_part(c, access, {}, ids=ids)
            tree = selectors.queue_tree(c)
            # GPUs already queued there (slices counted whole: an estimate), in one aggregate.
            queued_gpus = float(PodGroup.objects.filter(job__cluster=c, job__state=JobState.QUEUED).aggregate(
                n=Sum(F("gpu_count") * F("replicas")))["n"] or 0)
        snapshot = E.ClusterSnapshot(nodes=enodes, allocations=tuple(eallocs))
        running = selectors.running_jobs(snapshot, checkpointable=[k for k, v in ckpt.items() if v],
                                         runtime_estimates=estimates)
        policy = engine_policy(c.placement_policy) or E.default_policy(
            E.profile_for(snapshot, pending))
        usage: dict[str, float] = defaultdict(float)
        for rj in running:
            g = M.gpus_of(rj.pods)
            usage[rj.queue] += g
            usage[rj.queue.split("/", 1)[0]] += g
            usage[M.CLUSTER] += g
        limits: dict[str, float | None] = {
            M.CLUSTER: None if tree.quota.gpus_limit is None else float(tree.quota.gpus_limit)}
        for t in tree.tenants:
            limits[t.name] = None if t.quota.gpus_limit is None else float(t.quota.gpus_limit)
            for p in t.projects:
                limits[p.name] = None if p.quota.gpus_limit is None else float(p.quota.gpus_limit)
        trial = M.ClusterTrial(views[c.pk], E.Placer(E.ClusterState(snapshot), policy), running, now,
                               usage=dict(usage), limits=limits, queued_gpus=queued_gpus,
                               all_limits=room.limits, all_usage=room.usage,
                               memory_limits=room.memory_limits, memory_usage=room.memory_usage,
                               # this cluster's parts of the guarantees across all clusters
                               guarantees={k: (g[0], g[1], g[2].get(c.name, 0.0))
                                           for k, g in room.guarantees.items()},
                               np_usage={k: room.np_usage.get((k, c.name), 0.0) for k in room.guarantees})
        out.append(_Trial(c, trial, {int(j.name): j for j in pending}, access))
    return out


# --- the placement step ----------------------------------------------------------------------


@dataclass
class PlacementSummary:
    placed: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    busy: bool = False


def _floating_queue(limit: int, after: Job | None = None) -> list[Job]:
    """The head of the global queue: floating jobs still queued, placed or not (``after``:
    those behind that job, the step's next batch)."""
    rows = Job.objects.filter(floating=True, state=JobState.QUEUED)
    if after is not None:
        rows = rows.filter(Q(submitted_at__gt=after.submitted_at)
                           | Q(submitted_at=after.submitted_at, id__gt=after.pk))
    return list(without_cluster_bulk(rows.select_related("tenant", "project__tenant", "cluster"),  # the
                                     "cluster")  # audit's target names; not 500 copies of an inventory
                .order_by("submitted_at", "id")[:limit])


def _more_jobs(trials: list[_Trial], ids: list[int]) -> None:
    """A step's next batch as each open cluster's engine sees it, added to its trial (whose
    tentative reservations stay: the batch before is bound, not admitted yet)."""
    for tr in trials:
        if not tr.trial.view.closed_reason:
            pending, _ = selectors._pending_part(tr.cluster, tr.access, {}, ids=ids)
            tr.jobs.update({int(j.name): j for j in pending})


def placement_run(*, now: float | None = None) -> PlacementSummary | None:
    """One placement step over the global queue; None when another step holds the lock.

    It takes the queue's head (``PLACEMENT_BATCH`` jobs) and, while a batch was full and the
    batches have not yet spent ``PLACEMENT_BUDGET_S`` of wall time (or, when reading the
    clusters took longer, as long as that), the next batch behind it, on the same
    trials (each batch written in its own transaction, ``_step_writes``): at a burst of
    submissions one tick reaches past the oldest 500 jobs, which are often bound already and
    waiting for their cluster's cycle."""
    summary = PlacementSummary()
    with _placement_lock() as got:
        if not got:
            return None
        started = time.monotonic()
        jobs = _floating_queue(PLACEMENT_BATCH)
        if not jobs:
            return summary
        t = now if now is not None else timezone.now().timestamp()
        clusters = list(Cluster.objects.order_by("name"))
        views = cluster_views(clusters)
        trials = _trials(clusters, views, [j.pk for j in jobs], t)
        # The batches may take as long as the reading took (at least the budget): reading
        # every cluster is a step's fixed cost (~3–10 s at 8 openb-sized clusters, more than a
        # batch), so one batch a step would bind ~500 jobs per such read (BENCHMARKS §14).
        # (A budget of 0 still means one batch a step.)
        budget = max(PLACEMENT_BUDGET_S, time.monotonic() - started) if PLACEMENT_BUDGET_S > 0 else 0.0
        batches = time.monotonic()
        while True:
            _place_batch(jobs, clusters, trials, summary)
            if len(jobs) < PLACEMENT_BATCH or time.monotonic() - batches >= budget:
                break
            jobs = _floating_queue(PLACEMENT_BATCH, after=jobs[-1])
            if not jobs:
                break
            _more_jobs(trials, [j.pk for j in jobs])
        for tr in trials:
            tr.trial.undo()
    return summary


def _place_batch(jobs: list[Job], clusters: list[Cluster], trials: list[_Trial],
                 summary: PlacementSummary) -> None:
    """One batch of the global queue, in the global order, over the step's trials."""
    by_id = {j.pk: j for j in jobs}
    any_engine = {jid: tr.jobs[jid] for tr in trials for jid in tr.jobs if jid in by_id}
    usage: dict[str, float] = defaultdict(float)
    for tr in trials:
        for q, g in tr.trial.usage.items():
            usage[q] += g
    order = M.global_order([(j, j.queue) for j in any_engine.values()], usage)
    missing = [j for j in jobs if j.pk not in any_engine]  # no open cluster to see it
    wall = timezone.now()
    # Bound jobs whose victims are being evicted for them on their cluster: never moved
    # (the victims would be killed for nothing); they start there once the room is free.
    evicting = set(Job.objects.filter(state=JobState.PREEMPTING, preempted_by_id__in=list(by_id))
                   .values_list("preempted_by_id", flat=True))
    refused = _live_refusals(jobs, trials, wall)
    heads = [_pending(by_id[int(ejob.name)], ejob, trials, wall, refused.get(int(ejob.name), {}))
             for ejob, _ in order
             if not (by_id[int(ejob.name)].cluster_id is not None and int(ejob.name) in evicting)]
    clusters_by_name = {c.name: c for c in clusters}
    with _step_writes(clusters, jobs):
        M.step(heads, [tr.trial for tr in trials],
               bind=lambda p, name, decided: _bind_placed(p, clusters_by_name[name], decided, summary),
               unplaced=lambda p, decided: _unplaced(p, decided, summary),
               kept=lambda p, own, others: _kept(p.key, own, others))
        for job in missing:
            parts = _nowhere_parts(job, trials)
            if job.cluster is not None:  # bound, and no open cluster sees it: what each says now
                mine = job.cluster.name
                _kept(job, next((why for n, why in parts if n == mine), ""),
                      "; ".join(f"cluster {n}: {why}" for n, why in parts if n != mine))
                continue
            text = "; ".join(f"cluster {n}: {why}" for n, why in parts)
            _wait(job, f"Waiting for a cluster — {text}" if parts else "Waiting for a cluster — none exists",
                  summary)


def _nowhere_parts(job: Job, trials: list[_Trial]) -> list[tuple[str, str]]:
    """Why no open cluster sees the job: each cluster's name and why not."""
    choice = M.ClusterChoice.of(job.cluster_choice)
    return [(tr.cluster.name, M.excluded(choice, M.JobNeeds(), tr.trial.view) or "closed") for tr in trials]


def _kept(job: object, own: str, others: str | None) -> None:
    """A bound job that stays on its cluster this step: its ``placement_note`` (why not each
    other cluster) and, while its reason is still the placement's own ("Placed on cluster X
    (…)", not its cluster's cycle's yet), that reason are refreshed — written with the batch
    (``_StepWrites.flush``), only when they changed."""
    assert isinstance(job, Job) and job.cluster is not None
    step = _STEP.get()
    if step is None:
        return
    reason = job.reason
    if job.reason_kind == "placed" and own:
        reason = f"Placed on cluster {job.cluster} ({own})"[:500]
    note = job.placement_note if others is None else others[:500]  # None: a fresh bind's note stands
    if reason != job.reason or note != job.placement_note:
        step.kept.append((job.pk, job.cluster.pk, reason, note))


def _pending(job: Job, ejob: E.Job, trials: list[_Trial], wall: dt.datetime,
             refused: dict[str, str]) -> M.Pending:
    """A floating job as the placement step (``M.step``) sees it; ``refused``: the clusters
    still refused to it (``_live_refusals``)."""
    fresh = (job.cluster_id is not None and job.reason_kind == "placed"
             and (wall - job.updated_at).total_seconds() < PLACEMENT_FRESH_S)
    return M.Pending(job, {tr.cluster.name: tr.jobs.get(job.pk, ejob) for tr in trials}, job.tenant.name,
                     M.ClusterChoice.of(job.cluster_choice), _needs(ejob),
                     job.cluster.name if job.cluster is not None else None,
                     _avoided(job.cluster_choice or {}, wall), refused, fresh=fresh)


def _bind_placed(p: M.Pending, cluster: Cluster, decided: M.Choice, summary: PlacementSummary) -> bool:
    job = p.key
    assert isinstance(job, Job) and decided.probe is not None
    was = job.cluster_id
    head = f"Placed on cluster {cluster} ({decided.probe.text()})"
    if not _bind(job, cluster, head, decided.probe.text(), decided.others_text()):
        return False
    (summary.moved if was is not None else summary.placed).append(job.pk)
    return True


def _unplaced(p: M.Pending, decided: M.Choice, summary: PlacementSummary) -> None:
    """No cluster takes the job now: it waits in the global queue, or is rejected if none ever could."""
    assert isinstance(p.key, Job)
    (_reject if decided.never else _wait)(p.key, decided.reason(), summary)


@contextlib.contextmanager
def _cycle_locks(ids: list[int]) -> Iterator[bool]:
    """The cycle locks of these clusters (in id order), or False if any is busy."""
    with contextlib.ExitStack() as stack:
        for cid in sorted(set(ids)):
            if not stack.enter_context(cycle_lock(cid)):
                yield False
                return
        yield True


@dataclass
class _StepWrites:
    """What one batch of a placement step writes, in one transaction (``_step_writes``): the
    cycle locks it took (held until that transaction has committed), the rows it locked, the
    decisions to insert and the waiting jobs' reasons to update, each in one statement."""

    names: dict[int, str]
    claimed: set[int] = field(default_factory=set)
    """Unbound jobs of the batch whose rows it locked at its start (still queued, no cluster):
    the only unbound jobs it writes (binds, waits and rejections), so it never waits on a
    row another transaction holds; their binds cannot fail and are written together."""
    held: dict[int, contextlib.ExitStack] = field(default_factory=dict)
    cycles: set[int] = field(default_factory=set)
    """Clusters to ask for a cycle once the locks are released."""
    binds: list[Job] = field(default_factory=list)
    decisions: list[SchedulingDecision] = field(default_factory=list)
    waits: list[Job] = field(default_factory=list)
    kept: list[tuple[int, int, str, str]] = field(default_factory=list)
    """Bound jobs staying where they are whose texts changed (``_kept``): (job id, its cluster
    id as read, the reason if still the placement's own, the new note)."""

    def claim(self, jobs: list[Job]) -> None:
        """Lock the rows of the batch's unbound jobs; those another transaction holds now (a
        user cancelling one) are skipped until the next step. ``no_key``: as everywhere
        (common.py), so inserts of rows that refer to them (decisions, audit) never wait."""
        ids = [j.pk for j in jobs if j.cluster_id is None]
        rows = Job.objects.filter(pk__in=ids, state=JobState.QUEUED, cluster__isnull=True)
        if connection.vendor == "postgresql":
            rows = rows.select_for_update(no_key=True, skip_locked=True)
        self.claimed = set(rows.values_list("pk", flat=True))

    def hold(self, ids: list[int]) -> bool:
        """The cycle locks of these clusters, kept until the batch has committed; False if
        one is busy (then the ones this call took are released at once)."""
        new: list[int] = []
        for cid in sorted(set(ids) - set(self.held)):
            stack = contextlib.ExitStack()
            if not stack.enter_context(cycle_lock(cid)):
                stack.close()
                for c in new:
                    self.held.pop(c).close()
                return False
            self.held[cid] = stack
            new.append(cid)
        return True

    def release(self) -> None:
        for stack in self.held.values():
            stack.close()
        self.held.clear()

    def flush(self) -> None:
        """The claimed jobs' binds and waits, one statement each (their rows are locked, still
        queued and unbound), then the decisions."""
        now = timezone.now()
        _update_from_values(Job, [*_WAIT_COLUMNS, ("cluster_id", "bigint"), ("updated_at", "timestamptz")],
                            [(j.pk, j.reason, j.reason_kind, j.placement_note, None, None, j.cluster_id, now)
                             for j in self.binds], where=("state", JobState.QUEUED.value))
        _update_from_values(Job, _WAIT_COLUMNS, [(j.pk, j.reason, j.reason_kind, j.placement_note, None, None)
                                                 for j in self.waits], where=("state", JobState.QUEUED.value))
        self._flush_kept()
        _record_all(self.decisions)

    def _flush_kept(self) -> None:
        """The refreshed texts of bound jobs that stay (``_kept``), in two statements: their rows
        are locked first, skipping any another transaction holds (their cluster's cycle is
        writing them: it says its own why; the next step refreshes the note), and only those
        still queued on the cluster read are written; a reason only while the placement's
        own (``reason_kind`` "placed"), never over what the cycle wrote since."""
        if not self.kept:
            return
        rows = Job.objects.filter(pk__in=[k[0] for k in self.kept], state=JobState.QUEUED)
        if connection.vendor == "postgresql":
            rows = rows.select_for_update(no_key=True, skip_locked=True)
        now = {pk: (cid, kind, reason) for pk, cid, kind, reason in
               rows.values_list("pk", "cluster_id", "reason_kind", "reason")}
        out = []
        for pk, cid, reason, note in self.kept:
            if pk in now and now[pk][0] == cid:
                out.append((pk, reason if now[pk][1] == "placed" else now[pk][2], note))
        _update_from_values(Job, [("reason", "varchar"), ("placement_note", "varchar")], out,
                            where=("state", JobState.QUEUED.value))


_WAIT_COLUMNS = [("reason", "varchar"), ("reason_kind", "varchar"), ("placement_note", "varchar"),
                 ("queue_position", "integer"), ("queue_length", "integer")]


_STEP: contextvars.ContextVar[_StepWrites | None] = contextvars.ContextVar("placement_step", default=None)


@contextlib.contextmanager
def _step_writes(clusters: list[Cluster], jobs: list[Job]) -> Iterator[None]:
    """One transaction (and one audit batch) for a batch's binds, waits and rejections,
    instead of one per job: each commit ran its own audit seal and live-page push (~30 ms a
    job; bench/placement_step.py). The binds keep their rule — a conditional UPDATE made
    while holding the target's (and, for a move, the old cluster's) cycle lock — and the
    locks are held from the batch's first bind on a cluster until it has committed, so a
    cycle there never reads a batch half-written; the cycles are asked for once the locks
    are released."""
    writes = _StepWrites({c.pk: c.name for c in clusters})
    try:
        with transaction.atomic(), audit_batch():
            writes.claim(jobs)
            token = _STEP.set(writes)
            try:
                yield
                writes.flush()
            finally:
                _STEP.reset(token)
    finally:
        writes.release()
    for cid in sorted(writes.cycles):
        request_cycle(cid)


def _bind(job: Job, cluster: Cluster, reason: str, short: str, note: str = "") -> bool:
    """Bind (or move) a queued floating job to ``cluster`` under the cycle locks concerned;
    False when a lock is busy or the job changed meanwhile (the next step tries again).
    ``reason``: its own cluster's answer ("Placed on cluster X (fits now)"); ``note``: why not
    each other cluster (``placement_note``); its ``placed`` decision records both.
    Inside a placement step (``_step_writes``) in the step's transaction, else in its own."""
    old = job.cluster_id
    step = _STEP.get()
    if step is not None:
        if old is None and job.pk not in step.claimed:
            return False  # its row is another transaction's now: the next step
        if not step.hold([cluster.pk, *([old] if old else [])]):
            request_placement(countdown=1)
            return False
        return _bind_write(job, cluster, reason, short, note, step)
    with _cycle_locks([cluster.pk, *([old] if old else [])]) as got:
        if not got:
            request_placement(countdown=1)
            return False
        with transaction.atomic(), audit_batch():
            return _bind_write(job, cluster, reason, short, note, None)


def _bind_write(job: Job, cluster: Cluster, reason: str, short: str, note: str,
                step: _StepWrites | None) -> bool:
    old = job.cluster_id
    if step is not None and old is None:  # claimed (``_bind``): locked, written at the end
        job.cluster, job.reason, job.reason_kind = cluster, reason[:500], "placed"
        job.placement_note, job.queue_position, job.queue_length = note[:500], None, None
        job.updated_at = timezone.now()
        step.claimed.discard(job.pk)
        step.binds.append(job)
    else:
        match = Job.objects.filter(pk=job.pk, state=JobState.QUEUED, floating=True)
        match = match.filter(cluster__isnull=True) if old is None else match.filter(cluster_id=old)
        if step is not None and connection.vendor == "postgresql":
            # A move inside a step: the row first, never waiting for another transaction's.
            if not match.select_for_update(no_key=True, skip_locked=True).values_list("pk", flat=True):
                return False
        if not match.update(cluster=cluster, reason=reason[:500], reason_kind="placed",
                            placement_note=note[:500], queue_position=None, queue_length=None,
                            updated_at=timezone.now()):
            return False
        job.cluster = cluster
    said = f"{reason}; {note}" if note else reason
    decision = SchedulingDecision(job=job, cluster=cluster, kind=DecisionKind.PLACED, reason=said[:500],
                                  created_at=timezone.now())
    if step is not None:
        step.decisions.append(decision)
        step.cycles.add(cluster.pk)
        before = old and step.names.get(old)
    else:
        _record_all([decision])
        request_cycle(cluster.pk)
        before = old and Cluster.objects.get(pk=old).name
    audit_record(actor=None, actor_username=SCHEDULER, action="job.placed", target=job,
                 tenant=job.tenant, project=job.project, before={"cluster": before},
                 after={"cluster": cluster.name, "why": short})
    return True


def _wait(job: Job, reason: str, summary: PlacementSummary) -> None:
    summary.waiting.append(job.pk)
    if job.reason == reason[:500]:
        return
    step = _STEP.get()
    if step is not None:  # only claimed rows (locked): with the batch's other waits, at its end
        if job.pk in step.claimed:
            job.reason, job.reason_kind, job.placement_note = reason[:500], "clusters", ""
            job.queue_position = job.queue_length = None
            step.waits.append(job)
        return
    Job.objects.filter(pk=job.pk, state=JobState.QUEUED, cluster__isnull=True).update(
        reason=reason[:500], reason_kind="clusters", placement_note="", queue_position=None,
        queue_length=None)


_AGAIN = "; offered again once its nodes or quotas change"
"""Said of a cluster that refused a waiting job (``_refused_since``), not of a rejected one."""


def _reject(job: Job, reason: str, summary: PlacementSummary) -> None:
    step = _STEP.get()
    if step is not None and job.pk not in step.claimed:
        return  # its row is another transaction's now: the next step
    reason = reason.replace(_AGAIN, "")
    with transaction.atomic(), audit_batch():
        if not transition(job, "reject", reason=reason, fields={"reason_kind": "never-fits"},
                          where={"cluster__isnull": True}):
            return
    summary.rejected.append(job.pk)


# --- back to the global queue ----------------------------------------------------------------


def job_unplace(*, job_id: int, reason: str, avoid: str = "", refused: str = "",
                refused_fp: tuple[str, str] | None = None, locked: bool = False,
                from_cluster: int | None = None) -> bool:
    """Send a queued floating job back to the global queue (inside the caller's transaction
    or its own). ``avoid``: the message of a dispatch failure on its cluster, which is then
    avoided for ``AVOID_SECONDS``; ``refused``: why its cluster's cycle found it can never run
    there (rather than rejecting a floating job, the cycle sends it back: that cluster is then
    out for this job, the others are still tried), recorded with when and ``refused_fp``
    (required with ``refused``: (``refusal_fingerprint``, the refusal's kind); the refusal
    lapses once the fingerprint changes). ``from_cluster``: only
    if the job is still there. False for a pinned job, one not queued, or (unless the caller
    holds it: ``locked``) when its cluster's cycle lock is busy: a cycle of that
    cluster may be deciding about the job, so it stays there and a later tick tries again.
    (Should a cycle still read the job before this commits, its writes re-check the job's
    cluster under row lock: ``cycle._lock_rows``; a job bound elsewhere meanwhile is not
    admitted by the old cluster's cycle.)"""
    if refused and refused_fp is None:
        raise ValueError("a refusal needs its fingerprint (refused_fp)")
    if not locked:
        cluster_id = Job.objects.filter(pk=job_id).values_list("cluster_id", flat=True).first()
        if cluster_id is None:
            return False
        with cycle_lock(cluster_id) as got:
            if not got:
                logger.info("job %s: cluster %s's cycle is running; it is unplaced later", job_id, cluster_id)
                return False
            return job_unplace(job_id=job_id, reason=reason, avoid=avoid, refused=refused,
                               refused_fp=refused_fp, locked=True, from_cluster=from_cluster)
    with transaction.atomic():
        job = Job.objects.select_for_update(no_key=True, of=("self",)).select_related(
            "tenant", "project", "cluster").get(pk=job_id)
        if not job.floating or job.state != JobState.QUEUED or job.cluster_id is None:
            return False
        if from_cluster is not None and job.cluster_id != from_cluster:
            return False
        old = job.cluster
        assert old is not None
        choice = dict(job.cluster_choice or {})
        if avoid:
            failed = dict(choice.get("failed") or {})
            failed[old.name] = [timezone.now().isoformat(), avoid[:300],
                                dispatch_failures(choice, old.name) + 1]
            choice["failed"] = failed
        if refused and refused_fp is not None:
            choice["refused"] = {**(choice.get("refused") or {}), old.name: {
                "why": refused[:200], "at": timezone.now().isoformat(), "fp": refused_fp[0],
                "kind": refused_fp[1]}}
        job.cluster = None
        job.cluster_choice = choice
        job.reason = f"Back in the global queue: {reason}"[:500]
        job.reason_kind = "clusters"
        job.placement_note = ""
        job.queue_position = job.queue_length = None
        job.save(update_fields=["cluster", "cluster_choice", "reason", "reason_kind", "placement_note",
                                "queue_position", "queue_length", "updated_at"])
        SchedulingDecision.objects.create(job=job, cluster=old, kind=DecisionKind.UNPLACED,
                                          reason=job.reason)
        audit_record(actor=None, actor_username=SCHEDULER, action="job.unplaced", target=job,
                     tenant=job.tenant, project=job.project, before={"cluster": old.name},
                     after={"reason": reason[:300]})
        request_placement()
    return True


def cluster_unplace_queued(*, cluster_id: int, reason: str) -> list[int]:
    """An unreachable cluster's queued floating jobs go back to the global queue (running ones
    stay: a job never runs in two clusters)."""
    with cycle_lock(cluster_id) as got:
        if not got:  # its cycle is running: the next reconcile failure tries again
            logger.info("cluster %s: its cycle is running; its queued floating jobs are unplaced later",
                        cluster_id)
            return []
        ids = list(Job.objects.filter(cluster_id=cluster_id, floating=True, state=JobState.QUEUED)
                   .values_list("pk", flat=True))
        return [jid for jid in ids if job_unplace(job_id=jid, reason=reason, locked=True)]



# --- submit-time checks ------------------------------------------------------------------------



def _label_map(value: Any, field_name: str) -> dict[str, str]:
    if value in (None, ""):
        return {}
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()):
        raise ValidationError({field_name: ['Labels as {"key": "value"}, e.g. {"region": "eu-west"}.']})
    return dict(value)


@dataclass
class ChoiceContext:
    """What ``clean_choice`` reads, read once per request (a bulk submit of a thousand floating
    jobs reads the clusters and their views once, and each image's architectures once per
    project, instead of three or four queries a job)."""

    _enabled: dict[str, Cluster] | None = None
    _views: dict[int, M.ClusterView] | None = None
    _arches: dict[tuple[int, str], frozenset[str] | None] = field(default_factory=dict)
    _synced: set[int] | None = None
    _one: dict[int, M.ClusterView | None] = field(default_factory=dict)

    def synced(self) -> set[int]:
        """Ids of the clusters with a node synced (one query): a cluster with none refuses nothing."""
        if self._synced is None:
            nodes = Node.objects.filter(present=True)
            self._synced = set(nodes.values_list("cluster_id", flat=True).distinct())
        return self._synced

    def enabled(self) -> dict[str, Cluster]:
        if self._enabled is None:
            self._enabled = {c.name: c for c in Cluster.objects.filter(enabled=True)}
        return self._enabled

    def views(self) -> dict[int, M.ClusterView]:
        if self._views is None:
            self._views = cluster_views(list(self.enabled().values()))
        return self._views

    def view_of(self, cluster: Cluster) -> M.ClusterView | None:
        """One cluster's view, or None while it has no node synced (it refuses nothing then):
        a job pinned to it reads that cluster alone (two grouped queries), not every enabled
        cluster's nodes; once per request per cluster (a bulk submit)."""
        if cluster.pk not in self._one:
            views, synced = _cluster_facts([cluster])
            self._one[cluster.pk] = views[cluster.pk] if cluster.pk in synced else None
        return self._one[cluster.pk]

    def arches(self, project: Any, refs: set[str]) -> dict[str, frozenset[str]]:
        """Image reference → architectures, as ``project`` sees the catalog."""
        todo = {r for r in refs if (project.pk, r) not in self._arches}
        if todo:
            found = selectors.image_arches((project.tenant_id, project.pk, r) for r in todo)
            for r in todo:
                self._arches[(project.pk, r)] = found.get((project.pk, r))
        return {r: a for r in refs if (a := self._arches[(project.pk, r)])}


def clean_choice(value: Any, groups: list[dict[str, Any]], project: Any,
                 context: ChoiceContext | None = None) -> dict[str, Any]:
    """Validate a floating job's ``cluster_choice`` against the clusters and its images' platforms
    (as ``project`` sees the image catalog: the platform's, its tenant's and its own images).

    Errors name the field: ``cluster_choice.clusters``, ``cluster_choice.labels``, or
    ``groups[i].image`` when no allowed cluster has nodes of an architecture its image is
    built for."""
    ctx = context or ChoiceContext()
    if value in (None, ""):
        value = {}
    if not isinstance(value, dict):
        raise ValidationError({"cluster_choice": ['An object: {"clusters": [...], "labels": {...}}.']})
    unknown = set(value) - set(CHOICE_KEYS)
    if unknown:
        raise ValidationError({"cluster_choice": [f"Unknown key(s): {', '.join(sorted(unknown))}; "
                                                  f"use {', '.join(CHOICE_KEYS)}."]})
    names = value.get("clusters") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValidationError({"cluster_choice.clusters": ["A list of cluster names."]})
    labels = _label_map(value.get("labels"), "cluster_choice.labels")
    prefer = _label_map(value.get("prefer"), "cluster_choice.prefer")
    enabled = ctx.enabled()
    missing = [n for n in names if n not in enabled]
    if missing:
        raise ValidationError({"cluster_choice.clusters": [
            f"No enabled cluster named {', '.join(sorted(missing))}."]})
    choice = M.ClusterChoice.of({"clusters": names, "labels": labels})
    views = ctx.views()
    allowed = [v for v in views.values()
               if M.excluded(choice, M.JobNeeds(), replace(v, closed_reason="", reachable=True)) is None]
    if not allowed:
        field_name = "cluster_choice.labels" if labels else "cluster_choice"
        raise ValidationError({field_name: ["No enabled cluster matches this choice."]})
    refs = {str(g.get("image") or "busybox") for g in groups}
    arches = ctx.arches(project, refs)
    for i, g in enumerate(groups):
        need = arches.get(str(g.get("image") or "busybox"))
        if need and not any(need & v.arches for v in allowed):
            have = sorted({a for v in allowed for a in v.arches})
            raise ValidationError({f"groups[{i}].image": [
                f"The image is built for {', '.join(sorted('linux/' + a for a in need))}; "
                f"the clusters this job may use have {', '.join('linux/' + a for a in have)} nodes only."]})
    from .runnable import refuse_gpu_models_nowhere

    refuse_gpu_models_nowhere(groups, [cid for cid, v in views.items() if v in allowed], ctx)
    out: dict[str, Any] = {}
    if names:
        out["clusters"] = sorted(set(names))
    if labels:
        out["labels"] = labels
    if prefer:
        out["prefer"] = prefer
    return out
