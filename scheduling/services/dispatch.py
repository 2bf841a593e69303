"""Dispatch: a job's namespace and Kubernetes objects created on the backend, and stopping them."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from tenants.audit import audit_record, without_values
from tenants.models import Project, Quota, QuotaScope

from .. import selectors, signals
from ..backends import backend_for
from ..backends.base import (
    LABEL_ATTEMPT,
    LABEL_EXTERNAL,
    LABEL_JOB,
    LABEL_JOB_ID,
    LABEL_PROJECT,
    LABEL_PROJECT_ID,
    LABEL_REPLICA,
    LABEL_ROLE,
    LABEL_TENANT,
    MANAGED_BY,
    RENDEZVOUS_ENV,
    RENDEZVOUS_PORT,
    BackendError,
    BindPending,
    JobObjects,
    NamespaceSpec,
    PodSpec,
    SliceSpec,
    left_to_owner,
)
from ..backends.naming import job_object_name, namespace_name
from ..extensions import apply_job_spec_hooks
from ..models import (
    ACTIVE_STATES,
    EXTERNAL_KIND,
    FINAL_STATES,
    LOG_TAIL_BYTES,
    LOG_TAIL_LINES,
    Allocation,
    Cluster,
    ExternalPod,
    ExternalWorkload,
    Job,
    JobState,
    NamespaceBinding,
    PodLogTail,
    PodPhase,
    ProjectNamespace,
)
from .common import (
    _DISPATCH_LOCK_CLASS,
    MAX_ATTEMPTS,
    SCHEDULER,
    _locked_job,
    logger,
    not_ready_too_long,
    request_cycle,
    session_lock,
)
from .jobs import _preempted_reason, _release
from .lifecycle import transition

# --- dispatch ------------------------------------------------------------------------------


def project_namespace_ensure(*, cluster: Cluster, project: Project) -> str:
    """The project's namespace on ``cluster``, stored on first use (``ProjectNamespace``):
    ``naming.namespace_name`` (id-based, unique by construction), and should that name be
    taken anyway (a namespace kept from before, ``0005_i11b``), one with a numbered suffix.
    The unique constraint is the check: two projects never get one namespace."""
    row = ProjectNamespace.objects.filter(cluster=cluster, project=project).first()
    if row is not None:
        return row.name
    base = namespace_name(cluster.namespace_prefix, project.pk, project.name)
    for n in range(10):
        name = base if n == 0 else namespace_name(cluster.namespace_prefix, project.pk, f"{n}")
        try:
            with transaction.atomic():
                row = ProjectNamespace.objects.create(cluster=cluster, project=project, name=name)
                audit_record(actor=None, actor_username=SCHEDULER, action="namespace.assigned",
                             target=row, tenant=project.tenant, project=project,
                             after={"cluster": cluster.name, "namespace": name})
                return row.name
        except IntegrityError:
            row = ProjectNamespace.objects.filter(cluster=cluster, project=project).first()
            if row is not None:  # created concurrently for this project
                return row.name
    raise ValidationError({"namespace": [f"No free namespace name for project {project.name}."]})


def namespace_spec(job: Job, cluster: Cluster) -> NamespaceSpec:
    project = job.project
    labels = {MANAGED_BY: "camp", LABEL_TENANT: project.tenant.name, LABEL_PROJECT: project.name,
              LABEL_PROJECT_ID: str(project.pk)}
    quota: dict[str, str] = {}
    q = Quota.objects.filter(scope=QuotaScope.PROJECT, project=project).first()
    if q is not None:
        # A backstop mirroring the project's limits; Camp's own quota check comes first.
        if q.gpu_memory_mib_limit is not None:
            quota["requests.nvidia.com/gpumem"] = str(q.gpu_memory_mib_limit)
        if q.cpu_cores_limit is not None:
            quota["requests.cpu"] = str(q.cpu_cores_limit.normalize())
        if q.ram_mib_limit is not None:
            quota["requests.memory"] = f"{q.ram_mib_limit}Mi"
        if q.gpus_limit is not None:
            # nvidia.com/gpu counts vGPU devices (slices), at most max sharers per card.
            quota["requests.nvidia.com/gpu"] = str(math.ceil(q.gpus_limit) * 10)
    # A job admitted before namespaces were stored keeps the one its pods are in.
    name = job.namespace or selectors.project_namespace_name(cluster=cluster, project=project)
    return NamespaceSpec(name=name, labels=labels, quota=quota)


def job_specs(job: Job, cluster: Cluster) -> tuple[NamespaceSpec, JobObjects, list[PodSpec]]:
    """Everything to create for an admitted job, derived only from rows (deterministic)."""
    ns = namespace_spec(job, cluster)
    owner = job_object_name(job.name, job.pk)
    base_labels = {MANAGED_BY: "camp", LABEL_TENANT: job.tenant.name, LABEL_PROJECT: job.project.name,
                   LABEL_JOB: job.name[:63], LABEL_JOB_ID: str(job.pk)}
    allocs = list(job.allocations.select_related("group", "node").prefetch_related("slices__gpu")
                  .order_by("group_id", "replica"))
    distributed = len(allocs) > 1
    world = len(allocs)
    master = f"{allocs[0].pod_name}.{owner}.{ns.name}.svc" if allocs else ""
    pods: list[PodSpec] = []
    hostfile = []
    for rank, a in enumerate(allocs):
        g = a.group
        env = {str(k): str(v) for k, v in (g.env or {}).items()}
        env.update({"CAMP_JOB": job.name, "CAMP_JOB_ID": str(job.pk), "CAMP_ROLE": g.name,
                    "CAMP_ATTEMPT": str(job.attempts)})
        if job.checkpoint_capable and job.last_checkpoint:
            env["CAMP_RESUME_FROM"] = job.last_checkpoint
        if distributed:
            env.update({"MASTER_ADDR": master, "MASTER_PORT": str(RENDEZVOUS_PORT), "WORLD_SIZE": str(world),
                        "RANK": str(rank), "NODE_RANK": str(rank),
                        "LOCAL_WORLD_SIZE": str(max(1, g.gpu_count))})
        slices = tuple(
            SliceSpec(uuid=s.gpu.uuid, vendor=s.gpu.vendor,
                      memory_mib=s.memory_mib, cores_percent=s.cores_percent, container=s.container)
            for s in sorted(a.slices.all(), key=lambda s: (s.container, s.gpu.index))
        )
        if g.name != MPI_LAUNCHER:  # mpirun runs on the launcher; ranks go to the workers
            hostfile.append(f"{a.pod_name}.{owner}.{ns.name}.svc slots={max(1, g.gpu_count)}")
        pods.append(PodSpec(
            name=a.pod_name, namespace=ns.name, node=a.node.name, image=g.image,
            command=tuple(str(c) for c in (g.command or [])), env=env,
            labels={**base_labels, LABEL_ROLE: g.name, LABEL_REPLICA: str(a.replica),
                    LABEL_ATTEMPT: str(job.attempts)},
            cpu_millicores=a.cpu_millicores, ram_mib=a.ram_mib, slices=slices, owner=owner,
            subdomain=owner if distributed else "", duration_seconds=job.duration_seconds,
        ))
    data = {"job": job.name, "job-id": str(job.pk)}
    if job.kind == "mpi":
        data["hostfile"] = "\n".join(hostfile) + "\n"
    objs = JobObjects(name=owner, namespace=ns.name, labels=base_labels, data=data,
                      headless_service=distributed,
                      rendezvous=({LABEL_JOB_ID: str(job.pk), LABEL_ROLE: pods[0].labels[LABEL_ROLE],
                                   LABEL_REPLICA: pods[0].labels[LABEL_REPLICA]} if distributed else {}))
    # Workloads (workspaces/) add ports, volumes, pull secrets and objects (scheduling/extensions.py).
    objs, pods = apply_job_spec_hooks(job, ns, objs, pods)
    return ns, objs, pods


def with_rendezvous(pods: list[PodSpec], address: str) -> list[PodSpec]:
    """The pods with ``address`` (the backend's, e.g. a ClusterIP: no DNS needed) as their
    rendezvous host wherever their environment names one (``RENDEZVOUS_ENV``); unchanged
    when the backend gives none (rank 0's DNS name stays)."""
    if not address:
        return pods
    return [dataclasses.replace(p, env={**p.env, **{k: address for k in RENDEZVOUS_ENV if k in p.env}})
            for p in pods]


def external_spec(job: Job, spec: PodSpec) -> PodSpec:
    """An external job's pod as Camp binds it (issue 34): only Camp's labels (its watch follows
    the pod by them) and the placement; the pod's own image, command and env stay its own."""
    labels = {MANAGED_BY: "camp", LABEL_JOB_ID: str(job.pk), LABEL_ATTEMPT: str(job.attempts),
              LABEL_PROJECT_ID: str(job.project_id), LABEL_EXTERNAL: "true"}
    return dataclasses.replace(spec, labels=labels, env={}, owner="", volumes=(), volume_mounts=())


MPI_LAUNCHER = "launcher"
"""The pod group of an MPI job that runs ``mpirun`` (left out of the hostfile)."""


@contextlib.contextmanager
def _dispatching(job_id: int) -> Iterator[None]:
    """Mark a dispatch of ``job_id`` in flight, waiting for one already in flight (or for a
    release being committed, ``_dispatch_in_flight``). PostgreSQL: a session-level advisory
    lock (released here, or when a killed worker's connection drops); SQLite (the demo): an
    exclusive file lock."""
    if connection.vendor == "postgresql":
        with session_lock(_DISPATCH_LOCK_CLASS, job_id, wait=True):
            yield
        return
    with open(_dispatch_lock_path(job_id), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _dispatch_in_flight(job_id: int) -> bool:
    """Whether another worker is creating the job's pods right now. Call inside the
    transaction that would release the job's resources: on PostgreSQL the lock taken here
    is held until that transaction ends, so a dispatch starting meanwhile waits for the
    release and then sees the job's new state. (The same session's own dispatch, which
    holds the lock, is not "another": advisory locks are re-entrant per session.)"""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s)", [_DISPATCH_LOCK_CLASS, job_id])
            row = cursor.fetchone()
        return not (row and row[0])
    with open(_dispatch_lock_path(job_id), "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _dispatch_lock_path(job_id: int) -> Any:
    lock_dir = settings.VAR_DIR / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    return lock_dir / f"dispatch-{job_id}.lock"


def job_dispatch(*, job_id: int, final_attempt: bool = True) -> str:
    """Create the job's namespace, owner object, service and pods (idempotent).

    Retryable backend errors propagate when ``final_attempt`` is False (the task retries
    with backoff); otherwise a failure removes every pod already created (all or nothing)
    and requeues the job with the error as its reason, or fails it after MAX_ATTEMPTS.

    Race with a stop (cancel, preemption, eviction): while the pods are being created the
    dispatch is marked in flight, and a stop that finds no pods then does not release the
    job's resources (``_pods_gone``), since pods may be about to appear on those GPUs.
    Once the pods exist, the job's state is checked again under its row lock; if it left
    STARTING meanwhile the dispatch is "aborted" and stops the job itself (pods deleted,
    resources released once they are gone), so GPUs are never free in the database while
    pods run on them.

    "pending": a pod is bound and HAMi's device plugin has not answered within
    ``CAMP_HAMI_BIND_POLL_SECONDS``; the dispatch hands over (the task queues a follow-up
    dispatch, which resumes the wait; reconcile re-requests one if that is lost)."""
    with _dispatching(job_id):
        outcome, attempt = _dispatch(job_id, final_attempt)
    if outcome == "aborted":
        job_stop(job_id=job_id, attempt=attempt)
    return outcome


def _dispatch(job_id: int, final_attempt: bool) -> tuple[str, int]:
    """``job_dispatch``'s work: (outcome, the attempt it dispatched)."""
    job = Job.objects.select_related("tenant", "project", "cluster").get(pk=job_id)
    if job.state != JobState.STARTING:
        return "skipped", job.attempts
    cluster = job.placed_cluster
    # Tried even if its cluster was marked unreachable since the job's admission: after a
    # short outage the retries (job_dispatch's backoff) create its pods and keep those that
    # were created before it; only the last failure decides (below).
    backend = backend_for(cluster)
    ns, objs, pods = job_specs(job, cluster)
    external = job.kind == EXTERNAL_KIND
    try:
        if external:
            _bind_external(job, cluster, backend, pods)
        else:
            backend.ensure_namespace(ns)
            pods = with_rendezvous(pods, backend.ensure_job_objects(objs))
            for spec in pods:
                backend.create_pod(spec)
    except BindPending:
        # The device plugin has not answered yet: the pods stay as they are, and a follow-up
        # dispatch (the task queues one) or the watcher concludes.
        return "pending", job.attempts
    except BackendError as exc:
        if Job.objects.filter(pk=job_id, state=JobState.RUNNING).exists():
            # A redundant dispatch (redelivered after a worker died, or re-requested by
            # reconcile) of a job whose pods all run: its failure harms nothing, and
            # cleaning up would kill a healthy job.
            return "running", job.attempts
        if exc.retryable and not final_attempt:
            raise
        # Admitted just before its cluster stopped answering: requeued without counting the
        # attempt (it waits there, or a floating one goes elsewhere).
        down = exc.unreachable or Cluster.objects.filter(
            pk=cluster.pk, unreachable_since__isnull=False).exists()
        if external and exc.status == 404:
            _suspend_workload(job)  # a Job's other pods: its controller deletes them
            _external_pod_gone(job_id, job.attempts, exc)
            return "failed", job.attempts
        if external:
            _suspend_workload(job)
        for spec in pods:
            if external:
                continue  # never delete a pod Camp did not create because it could not bind it
            with contextlib.suppress(BackendError):
                backend.delete_pod(spec.namespace, spec.name, grace_seconds=0)
        with contextlib.suppress(BackendError):
            backend.delete_job_objects(objs.namespace, objs.name)
        if down:
            # The cluster did not answer: not the job's fault, so not one of its attempts.
            # (Pods created before it went down are orphans to its reconcile, which deletes
            # them once it answers.)
            requeued = _dispatch_unreachable(job_id, str(exc) if exc.unreachable else "",
                                             attempt=job.attempts)
            return ("requeued" if requeued else "aborted"), job.attempts
        # A refusal may echo the pod spec: never an env value in a reason, decision or log.
        message = without_values(str(exc), (v for env in job.groups.values_list("env", flat=True)
                                            for v in (env or {}).values()))
        failed = _dispatch_failed(job_id, message, attempt=job.attempts)
        return ("failed" if failed else "aborted"), job.attempts
    with transaction.atomic():
        current = Job.objects.select_for_update(no_key=True).only("state").get(pk=job_id)
        if current.state == JobState.RUNNING:
            # Its pods were created (by this or an earlier dispatch) and all run: the watch
            # saw them start while this one was still going. Nothing to undo.
            Allocation.objects.filter(job_id=job_id, phase=PodPhase.PENDING).update(
                phase=PodPhase.CREATED)
            return "running", job.attempts
        if current.state != JobState.STARTING:
            return "aborted", job.attempts  # stopped while its pods were being created
        Allocation.objects.filter(job_id=job_id, phase=PodPhase.PENDING).update(phase=PodPhase.CREATED)
    return "created", job.attempts


JOB_PODS_WAIT_SECONDS = 120
"""How long an admitted ``batch/v1`` Job's controller has to make its pods once un-suspended
before the dispatch gives up (the job requeued, the Job suspended again)."""


def _bind_external(job: Job, cluster: Cluster, backend: Any, pods: list[Any]) -> None:
    """Pods Camp did not create (issue 34): bound where the cycle placed them, in the namespace
    bound to the project; no namespace, objects or pods of Camp's own. A queued ``batch/v1``
    Job's pods are made by its controller once Camp un-suspends it (``_adopt_job_pods``)."""
    if not NamespaceBinding.objects.filter(cluster=cluster, namespace=job.namespace,
                                           project_id=job.project_id).exists():
        raise BackendError(f"Namespace {job.namespace} is no longer bound to the project; "
                           "Camp binds no pod there", status=404)
    workload = ExternalWorkload.objects.filter(job_id=job.pk).first()
    if workload is not None:
        _adopt_job_pods(job, workload, backend)
        pods = job_specs(job, cluster)[2]
    uids = dict(job.external_pods.values_list("name", "uid"))
    for spec in pods:
        backend.bind_external_pod(external_spec(job, spec), uids.get(spec.name, ""))


def _adopt_job_pods(job: Job, workload: ExternalWorkload, backend: Any) -> None:
    """Un-suspend an admitted Job (Kueue's admission) and take the pods its controller makes as
    the job's pods, one per placed replica (its ``ExternalPod`` rows and allocations' pod
    names): pods adopted by an earlier dispatch of this attempt stay (if not bound elsewhere);
    ``BindPending`` until the controller has made enough (a follow-up dispatch looks again), an
    error ``JOB_PODS_WAIT_SECONDS`` after the un-suspend (the job requeued, the Job suspended:
    a requeued job then asks for what the Job still needs, ``external._follow_width``)."""
    if workload.resumed_at is None or (job.admitted_at and workload.resumed_at < job.admitted_at):
        workload.resumed_at = timezone.now()
        ExternalWorkload.objects.filter(pk=workload.pk).update(resumed_at=workload.resumed_at)
    backend.suspend_job(workload.namespace, workload.name, workload.uid, False)
    allocs = list(job.allocations.select_related("node").order_by("group_id", "replica"))
    node_of = {a.replica: a.node.name for a in allocs}
    pods = backend.job_pods(workload.namespace, workload.uid)
    live = {p.metadata.uid: p for p in pods}
    mine = {e.replica: e for e in job.external_pods.all() if e.uid in live
            and live[e.uid].spec.node_name in (None, "", node_of.get(e.replica))}
    taken = set(ExternalPod.objects.filter(cluster_id=job.placed_cluster.pk, uid__in=list(live))
                .values_list("uid", flat=True))
    free = [p for p in pods if p.metadata.uid not in taken and not p.spec.node_name]
    missing = [a for a in allocs if a.replica not in mine]
    if len(free) < len(missing):
        waited = (timezone.now() - workload.resumed_at).total_seconds()
        said = (f"Job {workload.namespace}/{workload.name}'s controller has made {len(free)} of the "
                f"{len(missing)} pods Camp admitted")
        if waited > JOB_PODS_WAIT_SECONDS:
            raise BackendError(f"{said} within {JOB_PODS_WAIT_SECONDS} s")
        raise BindPending(said)
    try:
        with transaction.atomic():
            ExternalPod.objects.filter(job=job).exclude(pk__in=[e.pk for e in mine.values()]).delete()
            for a, p in zip(missing, free, strict=False):
                ExternalPod.objects.create(
                    job=job, cluster_id=job.placed_cluster.pk, namespace=workload.namespace,
                    name=p.metadata.name, uid=p.metadata.uid, replica=a.replica, owner_kind="Job",
                    owner_name=workload.name, service_account=p.spec.service_account_name or "")
                Allocation.objects.filter(pk=a.pk).update(pod_name=p.metadata.name[:63])
    except IntegrityError as exc:  # a pod (or a pod name) recorded for another job meanwhile
        raise BackendError(f"Job {workload.namespace}/{workload.name}'s pods could not be taken: "
                           f"{exc}", retryable=True) from exc


def _suspend_workload(job: Job) -> None:
    """A Job admitted as Kueue does goes back to suspended (its controller deletes its pods)
    when its Camp job is preempted, cancelled or could not start. Best effort: a Job gone
    needs nothing."""
    workload = ExternalWorkload.objects.filter(job_id=job.pk).first()
    if workload is None:
        return
    try:
        backend_for(job.placed_cluster).suspend_job(workload.namespace, workload.name, workload.uid, True)
    except BackendError as exc:
        logger.info("job %s: its Job %s was not suspended: %s", job.pk, workload, exc)


def _external_pod_gone(job_id: int, attempt: int, exc: BackendError) -> None:
    """An external job's pod was deleted (or replaced) before Camp bound it: nothing is left to
    run, so the job ends (if this dispatch's attempt is still the job's)."""
    with transaction.atomic():
        gone = _locked_job(job_id)
        if gone.state == JobState.STARTING and gone.attempts == attempt:
            _release(gone)
            transition(gone, "cancel", reason=f"Its pod is gone: {exc}"[:500])


def _dispatch_failed(job_id: int, message: str, *, attempt: int | None = None) -> bool:
    """Release and requeue (or fail) a job whose pods could not be created; False if the
    job had already left STARTING, or ``attempt`` is no longer its attempt (its stop, or
    whoever requeued it, takes over)."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state != JobState.STARTING or (attempt is not None and job.attempts != attempt):
            return False
        _release(job)
        reason = f"Could not create its pods: {message}"[:500]
        signals.dispatch_failed.send_robust(sender=Job, cluster_id=job.cluster_id, job_id=job.pk,
                                            message=message)
        tries = job.attempts
        if job.floating and job.cluster is not None:
            # One pool across clusters: attempts count per cluster (a failed cluster is
            # avoided for a while and the job tries the others), not across clusters.
            from .placement import dispatch_failures

            tries = dispatch_failures(job.cluster_choice, job.cluster.name) + 1
        if tries >= MAX_ATTEMPTS:
            transition(job, "fail", reason=reason)
            request_cycle(job.cluster_id, countdown=2)
        else:
            transition(job, "requeue", reason=reason + "; requeued", audit={"reason": reason}, countdown=2)
            if job.floating:
                # One pool across clusters: back to the global queue, this cluster avoided for
                # a while, so another cluster may take it (a job never runs in two).
                from .placement import job_unplace

                # No cycle lock needed: the job goes from STARTING straight to the global
                # queue in this transaction, so no cycle ever reads it queued here.
                job_unplace(job_id=job.pk, reason=f"its pods could not be created on {job.cluster}",
                            avoid=message, locked=True)
    return True


def _dispatch_unreachable(job_id: int, error: str, *, attempt: int | None = None) -> bool:
    """The job's cluster does not answer (``error``: what the dispatch got, to record on the
    cluster; "" when it is already marked unreachable): release and requeue the job without
    counting the attempt; a floating job goes back to the global queue (the cluster is not
    avoided as after a failure of its own: it is closed to every job until it answers). The
    cluster is marked unreachable (``cluster_reachability_record``): it takes no new work,
    and its reconcile reopens it. False if the job had already left STARTING."""
    from .clusters import cluster_closed_why, cluster_reachability_record

    cluster_id = Job.objects.filter(pk=job_id).values_list("cluster_id", flat=True).first()
    if cluster_id is None:
        return False
    if error:
        cluster_reachability_record(cluster_id=cluster_id, error=error)
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.state != JobState.STARTING or job.cluster_id != cluster_id or (
                attempt is not None and job.attempts != attempt):
            return False
        cluster = Cluster.objects.get(pk=cluster_id)
        why = cluster_closed_why(cluster)
        _release(job)
        waits = why.pinned if why else f"Cluster {cluster} does not answer"
        reason = f"{waits}; its pods were not created, requeued (this attempt is not counted)"[:500]
        transition(job, "requeue", reason=reason, countdown=2,
                   fields={"attempts": max(0, job.attempts - 1), "reason_kind": "cluster"},
                   audit={"reason": reason, "attempt_counted": False})
        if job.floating:
            from .placement import job_unplace

            # STARTING → the global queue in this transaction: no cycle reads it queued here.
            back = why.floating if why else f"cluster {cluster} does not answer"
            job_unplace(job_id=job.pk, reason=back, locked=True)
    return True


STOPPING_STATES = (JobState.PREEMPTING, *FINAL_STATES)
"""The states a queued stop acts in: a job back in the queue, or admitted again, is not its."""


def job_stop(*, job_id: int, attempt: int | None = None, queued: bool = False) -> str:
    """Delete a job's pods (with a grace period) and release its resources once gone.

    A stop is tied to the attempt it was queued for: with ``attempt`` it does nothing
    ("stale") once the job has been admitted again since, and a ``queued`` stop (the task)
    acts only on a job that is stopping (preempting, or ended): a stop delivered late, or
    twice, never touches the pods of a later attempt (their names are the same). Only pods
    of the job's current attempt are deleted (``camp.io/attempt``; pods made before that
    label existed count as current)."""
    job = Job.objects.select_related("tenant", "project", "cluster").get(pk=job_id)
    if (attempt is not None and job.attempts != attempt) or (
            queued and job.state not in STOPPING_STATES):
        return "stale"
    backend = backend_for(job.placed_cluster)
    allocs = list(job.allocations.select_related("node", "group"))
    names = [a.pod_name for a in allocs]
    if not names:
        return "nothing"
    ns = namespace_spec(job, job.placed_cluster).name
    if job.kind == EXTERNAL_KIND and job.state in (JobState.PREEMPTING, JobState.CANCELLED):
        _suspend_workload(job)  # first: its controller would replace the pods deleted below
    gone, unreachable = _on_dead_nodes(allocs), _on_unreachable_nodes(allocs)
    _keep_log_tails(backend, job, ns, [a for a in allocs if a.node.ready and a.node.present])
    listed = {p.name: p for p in backend.list_pods() if p.namespace == ns and p.name in names}
    kept = {name for name, p in listed.items() if left_to_owner(p)}  # finished, not Camp's pods
    for name in names:
        pod = listed.get(name)
        if pod is not None and pod.labels.get(LABEL_ATTEMPT, str(job.attempts)) != str(job.attempts):
            continue  # another attempt's pod of the same name: not this stop's
        if name in kept:
            continue
        if pod is not None or name in gone:
            backend.delete_pod(ns, name, grace_seconds=0 if name in gone else 30)
    remaining = ({p.name for p in backend.list_pods()} & set(names)) - gone - unreachable - kept
    if remaining or not _pods_gone(job_id):
        # The reconcile task releases once the pods are gone (or the dispatch in flight,
        # finding the job stopped, stops it again).
        return "waiting"
    return "released"


def _keep_log_tails(backend: Any, job: Job, ns: str, allocs: list[Allocation]) -> None:
    """Keep the last lines of each pod's log before it is deleted (``PodLogTail``; a later
    stop of the same attempt refreshes them): Kubernetes forgets a deleted pod's log, and a
    finished job's output is what its user reads next. Best effort: a pod already gone, or a
    log that cannot be read, keeps what was kept. Pods on nodes that are not Ready are not
    asked (their kubelet does not answer)."""
    for a in allocs:
        try:
            text = backend.pod_logs(ns, a.pod_name, tail_lines=LOG_TAIL_LINES)
        except BackendError:
            continue
        if text:
            PodLogTail.objects.update_or_create(
                job=job, attempt=job.attempts, pod_name=a.pod_name,
                defaults={"tenant_id": job.tenant_id, "role": a.group.name, "text": text[-LOG_TAIL_BYTES:]})


def _on_dead_nodes(allocs: list[Allocation]) -> set[str]:
    """Pods on a node that left the cluster (its Node object is gone): force-deleted and
    counted as gone, as Kubernetes' pod garbage collector does for pods of nodes that no
    longer exist. Never for a node that is merely NotReady (``_on_unreachable_nodes``)."""
    return {a.pod_name for a in allocs if not a.node.present}


def _on_unreachable_nodes(allocs: list[Allocation]) -> set[str]:
    """Pods on a node NotReady for longer than the toleration: deleted gracefully (the
    kubelet, when it is back, stops them) and, like a ReplicaSet's or Job's pods after the
    taint manager's eviction, no longer waited for: their job is released. The node takes
    no new work until it is Ready again (it is quarantined)."""
    return {a.pod_name for a in allocs if a.node.present and not_ready_too_long(a.node)}


def _pods_gone(job_id: int) -> bool:
    """The job's pods are gone: release, and requeue a preempted job or end a finished one.

    Not while another worker is dispatching the job (False): pods it is creating would run
    on GPUs the database shows free (``job_dispatch`` stops the job again when it ends)."""
    with transaction.atomic():
        if _dispatch_in_flight(job_id):
            return False
        job = _locked_job(job_id)
        released = _release(job)
        workload = job.kind == EXTERNAL_KIND and ExternalWorkload.objects.filter(job_id=job.pk).exists()
        if job.state == JobState.PREEMPTING and workload:
            # A Job admitted as Kueue does: suspended again (its pods deleted by its
            # controller) and queued again, as Kueue requeues an evicted workload; its next
            # admission adopts the pods the controller then makes.
            preemptor = job.preempted_by
            ExternalPod.objects.filter(job=job).delete()
            transition(job, "requeue", reason=(
                f"{_preempted_reason(job, preemptor)}; its Job was suspended; requeued" if preemptor
                else f"{job.reason}; its Job was suspended; requeued")[:500],
                decision={"preemptor": preemptor})
        elif job.state == JobState.PREEMPTING and job.kind == EXTERNAL_KIND:
            # An external pod, evicted as kube-scheduler's preemption does (deleted): its
            # owner (a Job, a ReplicaSet) makes a new pod, which queues as a new job.
            preemptor = job.preempted_by
            transition(job, "cancel", reason=(
                f"{_preempted_reason(job, preemptor)}; its pod was deleted" if preemptor
                else f"{job.reason}; its pod was deleted")[:500])
        elif job.state == JobState.PREEMPTING:
            preemptor = job.preempted_by
            note = " (resumes from its latest checkpoint)" if job.checkpoint_capable else ""
            transition(job, "requeue", reason=(
                f"{_preempted_reason(job, preemptor)}; requeued{note}" if preemptor
                else job.reason.replace("Rescheduling", "Requeued") + note),
                decision={"preemptor": preemptor})
        elif job.state in ACTIVE_STATES:
            # Pods vanished under a starting/running job: lost. Checkpointed jobs resume.
            if job.checkpoint_capable and job.attempts < MAX_ATTEMPTS:
                transition(job, "requeue",
                           reason="Its pods were lost; requeued (resumes from its latest checkpoint)")
            else:
                transition(job, "fail", reason="Its pods disappeared from the cluster")
        if released:
            request_cycle(job.cluster_id)
    if released:
        _job_objects_delete(job)
    return True


def _job_objects_delete(job: Job) -> None:
    """The job's pods are gone: delete its ConfigMap, headless Service and owned extras
    (a requeued job's next dispatch makes them again, for its new placement). Best effort:
    reconcile deletes what is left (``_sweep_job_objects``)."""
    try:
        backend_for(job.placed_cluster).delete_job_objects(namespace_spec(job, job.placed_cluster).name,
                                                    job_object_name(job.name, job.pk))
    except BackendError as exc:
        logger.info("job %s: its objects are left for reconcile: %s", job.pk, exc)
