"""Reconcile: pod states read back from the backend (periodic sweep or pod events), lost pods and
jobs, and leftover objects."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from ..backends import backend_for, podcause
from ..backends.base import (
    MANAGED_BY,
    BackendError,
    PodEvent,
    PodStatus,
    attempt_of,
    left_to_owner,
    refusal_message,
)
from ..models import (
    FINAL_STATES,
    Allocation,
    Cluster,
    Job,
    JobState,
    PodPhase,
)
from .common import MAX_ATTEMPTS, _locked_job, enqueue
from .dispatch import _dispatch_failed, _dispatch_in_flight, _on_dead_nodes, _on_unreachable_nodes, _pods_gone
from .jobs import job_evict
from .lifecycle import transition

OBJECT_SWEEP_SECONDS = 60


def _sweep_job_objects(backend: Any, cluster: Cluster, result: ReconcileResult) -> None:
    """Per-job objects of jobs that hold nothing (ended, requeued or deleted) are deleted:
    what ``_job_objects_delete`` could not (a crash, an unreachable API server). At most
    once a minute per cluster (one list call)."""
    if not cache.add(f"camp:objects-swept:{cluster.pk}", 1, timeout=OBJECT_SWEEP_SECONDS):
        return
    found = backend.list_job_objects()
    if not found:
        return
    holding = set(Allocation.objects.filter(job_id__in={j for _, _, j in found}).values_list(
        "job_id", flat=True))
    starting = set(Job.objects.filter(pk__in={j for _, _, j in found},
                                      state=JobState.STARTING).values_list("pk", flat=True))
    for namespace, name, job_id in found:
        if job_id in holding or job_id in starting:
            continue
        with contextlib.suppress(BackendError):
            backend.delete_job_objects(namespace, name)
            result.objects_deleted.append(name)


# --- reconcile -----------------------------------------------------------------------------


# How long an admitted job may miss pods before reconcile asks for its dispatch again (when
# no dispatch of it is running). Short: a duplicate dispatch is harmless (idempotent).
DISPATCH_GRACE_SECONDS = 5


@dataclass
class ReconcileResult:
    started: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    redispatched: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    orphans_deleted: list[str] = field(default_factory=list)
    objects_deleted: list[str] = field(default_factory=list)


def cluster_reconcile(*, cluster: Cluster, pods: list[PodStatus] | None = None,
                      backend: Any = None) -> ReconcileResult:
    """Converge the database and the cluster (after events, crashes or lost events).

    Rules: pod phases map to job states (all running → Running; all succeeded →
    Succeeded; any failed → Failed); a job whose pods are gone releases its resources
    (preempted ones are requeued); an admitted job whose pods were never created gets
    them (re)created; pods that belong to no admitted job (orphans) are deleted."""
    backend = backend or backend_for(cluster)
    if pods is None:
        pods = backend.list_pods()
    by_name = {p.name: p for p in pods}
    result = ReconcileResult()
    allocs: dict[int, list[Allocation]] = defaultdict(list)
    for a in Allocation.objects.filter(cluster=cluster).select_related("job", "node"):
        allocs[a.job_id].append(a)
    known = {a.pod_name for rows in allocs.values() for a in rows}
    for job_id, rows in allocs.items():
        _reconcile_job(backend, job_id, rows, by_name, result)
    for p in pods:
        if p.name not in known and p.labels.get(MANAGED_BY) == "camp" and not p.deleting \
                and not left_to_owner(p):
            with contextlib.suppress(BackendError):
                backend.delete_pod(p.namespace, p.name, grace_seconds=30)
            result.orphans_deleted.append(p.name)
    _sweep_job_objects(backend, cluster, result)
    return result


def _reconcile_ending(backend: Any, job: Job, rows: list[Allocation], present: list[PodStatus],
                      result: ReconcileResult) -> None:
    """A finished or preempted job's pods: those on dead nodes go at once; when none is left
    alive the resources are given back, else the live ones are asked to stop (30 s grace)."""
    dead, unreachable = _on_dead_nodes(rows), _on_unreachable_nodes(rows)
    for p in present:
        if p.name in dead or (p.name in unreachable and not p.deleting):
            with contextlib.suppress(BackendError):
                backend.delete_pod(p.namespace, p.name, grace_seconds=0 if p.name in dead else 30)
    present = [p for p in present if p.name not in dead and p.name not in unreachable]
    live = [p for p in present if p.phase in ("Pending", "Running")]
    if not present or (job.state in FINAL_STATES and not live):
        # Finished pods hold nothing; clean them up and give the resources back.
        for p in present:
            if left_to_owner(p):
                continue
            with contextlib.suppress(BackendError):
                backend.delete_pod(p.namespace, p.name, grace_seconds=0)
        if _pods_gone(job.pk):
            result.released.append(job.pk)
    else:
        for p in present:
            if not p.deleting:
                with contextlib.suppress(BackendError):
                    backend.delete_pod(p.namespace, p.name, grace_seconds=30)


def _reconcile_job(backend: Any, job_id: int, rows: list[Allocation], pods: dict[str, PodStatus],
                   result: ReconcileResult, *, complete: bool = True, deleted: str = "") -> None:
    """The reconcile rules for one job. ``complete``: ``pods`` is a full list of the cluster's
    pods (a pod missing from it is gone); else it is the watcher's partial view, where only
    ``deleted`` (the pod of a DELETED event) is known to be gone."""
    if not rows:
        return  # released meanwhile (another worker, an eviction): nothing left to converge
    job = rows[0].job
    # Pod names repeat across attempts: a pod of another attempt (a late event, one still
    # terminating) is not this attempt's pod (``camp.io/attempt``).
    pods = {name: p for name, p in pods.items() if attempt_of(p, job.attempts)}
    present = [pods[a.pod_name] for a in rows if a.pod_name in pods]
    phases = [p.phase for p in present]
    if job.state in FINAL_STATES or job.state == JobState.PREEMPTING:
        _reconcile_ending(backend, job, rows, present, result)
        return
    # STARTING / RUNNING
    _update_phases(rows, pods)
    refused = next((p for p in present if p.refused), None)
    if refused is not None and job.state == JobState.STARTING:
        # The node's device plugin refused the pod at admission: the dispatch failed (not the
        # job), whichever sees it first; requeued with the reason, as on the dispatch's path.
        if _admission_refused(backend, job, present, refused):
            result.requeued.append(job_id)
        return
    if "Failed" in phases:
        failed = next(p for p in present if p.phase == "Failed")
        if not _end(job_id, JobState.FAILED, f"Pod {failed.name} failed: {podcause.failure(failed)}"):
            _stop_after_commit_now(job_id, job.attempts)  # ended meanwhile: its pods go all the same
        result.finished.append(job_id)
        return
    if len(present) == len(rows) and all(ph == "Succeeded" for ph in phases):
        if not _end(job_id, JobState.SUCCEEDED, "All pods succeeded"):
            _stop_after_commit_now(job_id, job.attempts)
        result.finished.append(job_id)
        return
    if job.state == JobState.RUNNING and not present:
        if _pods_gone(job_id):
            result.released.append(job_id)
        return
    # A pod that was created and then vanished (deleted, or being deleted: its node drained,
    # someone ran kubectl delete) is lost. The job's other pods cannot go on without it
    # (a gang's ranks wait on each other), so the whole job restarts (or ends).
    # Only pods known to have existed: all of a running job's, or one seen running (a list
    # taken just before a dispatch finished does not show its new pods yet).
    seen = [a for a in rows if job.state == JobState.RUNNING or a.phase in (
        PodPhase.RUNNING, PodPhase.SUCCEEDED) or a.pod_name == deleted]
    lost = sorted(a.pod_name for a in seen if (
        (a.pod_name in pods and pods[a.pod_name].deleting)
        or (a.pod_name not in pods and (complete or a.pod_name == deleted))))
    if lost:
        if _job_lost_pod(job_id, lost[0]):
            result.lost.append(job_id)
        return
    if len(present) < len(rows) or any(p.binding for p in present):
        admitted = job.admitted_at or timezone.now()
        if job.state == JobState.STARTING and complete and timezone.now() - admitted > dt.timedelta(
                seconds=DISPATCH_GRACE_SECONDS) and _dispatch_lost(job_id):
            # Admitted but pods missing (or a handshake left waiting) and no dispatch running:
            # it was lost with a killed worker (its Redis message only comes back after the
            # visibility timeout), or a follow-up dispatch was.
            enqueue("job_dispatch", job_id)
            result.redispatched.append(job_id)
        return
    if job.state == JobState.STARTING and "Pending" in phases and _cannot_start(
            backend, job, present, result):
        return
    # Running means serving: a pod with a readiness probe counts once it is Ready (kubelet).
    if job.state == JobState.STARTING and all(
            p.phase == "Succeeded" or (p.phase == "Running" and (p.ready or not p.probed)) for p in present):
        with transaction.atomic():
            fresh = Job.objects.select_related("tenant", "project").get(pk=job_id)
            if transition(fresh, "start", reason="Running", said="All pods are running"):
                result.started.append(job_id)


# A Pending pod's events and claims are read at most this often (one pod read, its claims
# and one event list: only for pods that have been Pending this long since admission).
PROBLEM_READ_SECONDS = 10
PROBLEM_READ_PODS = 3


def _cannot_start(backend: Any, job: Job, present: list[PodStatus], result: ReconcileResult) -> bool:
    """A starting job whose pod reports a problem that stops it starting (an image that
    cannot be pulled, a configuration error, an unbound volume, a refusal by its node):
    the job's reason says so in words; once ``podcause.start_deadline()`` has passed since
    admission (at once for a problem no wait cures) the job gives up, freeing what it
    holds: failed for an image or configuration problem, else requeued (failed once it has
    used its attempts). True when the job gave up."""
    pending = [p for p in present if p.phase == "Pending" and not p.deleting]
    # The pods' own statuses first (no API call); else, for a job Pending a while, one pod's
    # claims and events, of its first PROBLEM_READ_PODS pending pods, at most every
    # PROBLEM_READ_SECONDS (a 64-pod gang pulling a large image costs a few reads, not 64),
    # the answer kept for the reconciles in between.
    problem, pod = next(((podcause.waiting_problem(p), p.name) for p in pending
                         if podcause.waiting_problem(p)), ("", ""))
    read = getattr(backend, "pod_problem", None)
    admitted = job.admitted_at or timezone.now()
    if not problem and pending and read is not None:
        key = f"camp:pod-problem:{job.pk}:{job.attempts}"
        if timezone.now() - admitted > dt.timedelta(seconds=PROBLEM_READ_SECONDS) and cache.add(
                f"{key}:read", 1, timeout=PROBLEM_READ_SECONDS):
            for p in pending[:PROBLEM_READ_PODS]:
                with contextlib.suppress(BackendError):
                    problem, pod = read(p.namespace, p.name), p.name
                if problem:
                    break
            cache.set(key, [pod, problem], timeout=60)
        else:
            pod, problem = cache.get(key) or ("", "")
    if not problem:
        return False
    reason = f"Pod {pod} cannot start: {problem}"[:500]
    waited = timezone.now() - (job.admitted_at or timezone.now())
    if not podcause.hopeless(problem) and waited < dt.timedelta(seconds=podcause.start_deadline()):
        if job.reason != reason:
            Job.objects.filter(pk=job.pk, state=JobState.STARTING).update(
                reason=reason, reason_kind="", updated_at=timezone.now())
        return False
    given_up = f"{reason} (gave up after {int(waited.total_seconds())} s)"
    if podcause.gives_up_by_failing(problem) or job.attempts >= MAX_ATTEMPTS:
        if not _end(job.pk, JobState.FAILED, given_up):
            _stop_after_commit_now(job.pk, job.attempts)
        result.finished.append(job.pk)
        return True
    if job_evict(job_id=job.pk, reason=given_up):
        result.lost.append(job.pk)
    return True


def _admission_refused(backend: Any, job: Job, present: list[PodStatus], refused: PodStatus) -> bool:
    """A starting job's pod was refused at admission (``PodStatus.refused``): its pods of this
    attempt are deleted (by UID: a later attempt's pod of the same name is never touched) and
    the job is requeued like a failed dispatch (``_dispatch_failed``: failed after
    ``MAX_ATTEMPTS``). Left to the dispatch while one is in flight: its poll sees the same
    refusal and concludes (False)."""
    with transaction.atomic():
        if _dispatch_in_flight(job.pk):
            return False
    for p in present:
        with contextlib.suppress(BackendError):
            backend.delete_pod(p.namespace, p.name, grace_seconds=0, uid=p.uid)
    with transaction.atomic():
        if _dispatch_in_flight(job.pk):
            return False
        return _dispatch_failed(job.pk, refusal_message(refused.node, refused.name),
                                attempt=job.attempts)


def _dispatch_lost(job_id: int) -> bool:
    """No dispatch of the job is running now (its advisory lock is free) and none was
    re-requested in the last ``DISPATCH_GRACE_SECONDS`` (requests coalesce)."""
    with transaction.atomic():
        if _dispatch_in_flight(job_id):
            return False
    return bool(cache.add(f"camp:dispatch-requested:{job_id}", 1, timeout=DISPATCH_GRACE_SECONDS))


def _job_lost_pod(job_id: int, pod: str) -> bool:
    """A pod of a starting/running job is gone: restart the whole job (requeued; a
    checkpoint-capable one resumes from its latest checkpoint), or fail it once it has used
    its ``MAX_ATTEMPTS``. Its other pods are deleted and its resources released."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state not in (JobState.STARTING, JobState.RUNNING):
            return False
        if job.state == JobState.STARTING and _dispatch_in_flight(job_id):
            return False  # its dispatch deletes (a refusal) and makes pods as it goes: it concludes
        what = f"pod {pod} was lost (deleted or evicted from its node)"
        if job.attempts >= MAX_ATTEMPTS:
            return transition(job, "fail", reason=f"{what[0].upper()}{what[1:]}; failed after "
                                                  f"{job.attempts} attempts")
    return job_evict(job_id=job_id, reason=f"{what}; restarting all its pods")


def pod_event_watch_apply(*, cluster: Cluster, event: PodEvent, pods: dict[str, PodStatus]) -> str:
    """One event of the watch stream (``camp_watch``): ``pods``, the watcher's view of the
    cluster's managed pods by name, is updated, then ``pod_event_apply``. Matched by UID: a
    DELETED for a pod whose name a newer pod has taken (a late event) leaves the newer one in
    the view, and its pod's attempt decides which job attempt it concerns."""
    pod = event.pod
    current = pods.get(pod.name)
    if event.type == "DELETED":
        if current is not None and current.uid and pod.uid and current.uid != pod.uid:
            return "stale"  # an earlier pod of that name; the one in the view is newer
        pods.pop(pod.name, None)
    else:
        pods[pod.name] = pod
    return pod_event_apply(cluster=cluster, pod_name=pod.name, pods=pods,
                           deleted=event.type == "DELETED", pod=pod)


def pod_event_apply(*, cluster: Cluster, pod_name: str, pods: dict[str, PodStatus],
                    deleted: bool = False, pod: PodStatus | None = None) -> str:
    """Apply one watched pod event: the reconcile rules, for the one job the pod belongs to.

    ``pods`` is the watcher's current view of the cluster's managed pods (by name) with the
    event already applied; ``deleted``: the event was DELETED (the pod is gone); ``pod``: the
    event's pod. An event for a pod of another attempt than the job's current one (names
    repeat across attempts: a late event) changes nothing ("stale"). A pod that belongs to no
    allocation is an orphan and deleted (the same rule as ``cluster_reconcile``). Returns
    what was done, for logging."""
    job_id = Allocation.objects.filter(cluster=cluster, pod_name=pod_name).values_list(
        "job_id", flat=True).first()
    if job_id is None:
        orphan = pods.get(pod_name)
        if orphan is None or orphan.deleting or orphan.labels.get(MANAGED_BY) != "camp" or left_to_owner(
                orphan):
            return "ignored"
        with contextlib.suppress(BackendError):
            backend_for(cluster).delete_pod(orphan.namespace, orphan.name, grace_seconds=30,
                                            uid=orphan.uid)
        return "orphan-deleted"
    # The job's allocations may be released between the two queries (an eviction or a stop
    # on another worker): then there is nothing left to converge (``_reconcile_job``).
    allocs = list(Allocation.objects.filter(job_id=job_id).select_related("job", "node"))
    if pod is not None and allocs and not attempt_of(pod, allocs[0].job.attempts):
        return "stale"
    result = ReconcileResult()
    _reconcile_job(backend_for(cluster), job_id, allocs, pods, result, complete=False,
                   deleted=pod_name if deleted else "")
    for name in ("started", "finished", "released", "lost", "redispatched", "requeued"):
        if job_id in getattr(result, name):
            return name
    return "observed" if allocs else "released-meanwhile"


def _update_phases(rows: list[Allocation], pods: dict[str, PodStatus]) -> None:
    mapping = {"Pending": PodPhase.CREATED, "Running": PodPhase.RUNNING,
               "Succeeded": PodPhase.SUCCEEDED, "Failed": PodPhase.FAILED}
    for a in rows:
        p = pods.get(a.pod_name)
        phase = mapping.get(p.phase, PodPhase.CREATED) if p else (
            PodPhase.GONE if a.phase not in (PodPhase.PENDING,) else PodPhase.PENDING)
        ready = bool(p and p.ready and phase == PodPhase.RUNNING)
        if a.phase != phase or a.ready != ready:
            Allocation.objects.filter(pk=a.pk).update(phase=phase, ready=ready,
                                                      message=(p.message if p else "")[:500])


def _end(job_id: int, state: str, reason: str) -> bool:
    """The job ended (its pods succeeded, or one failed); False if it had left STARTING/RUNNING."""
    with transaction.atomic():
        job = _locked_job(job_id)
        return transition(job, "succeed" if state == JobState.SUCCEEDED else "fail", reason=reason)


def _stop_after_commit_now(job_id: int, attempt: int | None = None) -> None:
    enqueue("job_stop", job_id, attempt)
