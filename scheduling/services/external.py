"""Camp as the cluster's GPU scheduler (issue 34): namespaces bound to a project, and the pods
there that name Camp's scheduler, queued as the project's ``external`` jobs.

- ``namespace_bind``/``namespace_unbind``: a project admin (``can``) binds a namespace Camp did
  not create to the project; the binding is a row (``NamespaceBinding``, one per namespace of a
  cluster) and labels Camp owns on the namespace (one installation, one project).
- ``external_pods_sync``: the pods of the cluster that name Camp's scheduler and are not bound
  become jobs of kind ``external`` (``jobs.job_submit``: the same queue, quotas, fair share and
  preemption as any job; the lifecycle stays the one writer of their state). A gang
  (``scheduling.x-k8s.io/pod-group`` label, or Volcano's ``scheduling.k8s.io/group-name``
  annotation) is one job of all its pods, made once ``minMember`` of them exist. Why a pod is
  not bound is written on it (a Warning Event and its ``PodScheduled`` condition); a pod in a
  namespace not bound, or one Camp refuses, is never bound. ``camp_watch`` runs it every few
  seconds; the cycle places, ``dispatch.job_dispatch`` binds (HAMi's handshake on HAMi nodes).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterable
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from kubernetes.utils import parse_quantity

from tenants import permissions
from tenants.audit import audit_record
from tenants.models import Project, User

from ..backends import backend_for
from ..backends.base import BackendError
from ..backends.kubernetes import scheduler_name
from ..models import (
    EXTERNAL_KIND,
    PRIORITY_VALUES,
    Backend,
    Cluster,
    ExternalPod,
    ExternalWorkload,
    Job,
    JobState,
    NamespaceBinding,
    PriorityClass,
    PriorityClassMapping,
)
from .common import _require, logger
from .jobs import job_submit, job_terminate

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
"""The coscheduling plugin's pod-group label (kubernetes-sigs/scheduler-plugins)."""
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""Volcano's pod-group annotation."""
MIN_MEMBER_ANNOTATIONS = ("camp.io/min-member", "scheduling.volcano.sh/min-member")
"""How many pods of a gang must exist before it is queued (the PodGroup's ``minMember``, read
from the pods, not from a PodGroup object); without it, the pods that exist."""
QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "camp.io/queue-name")
"""A ``batch/v1`` Job carrying one of these labels is admitted by Camp as Kueue admits it
(suspended until admitted): Kueue's own label, so a team switches without editing manifests, or
Camp's. The value (a LocalQueue name) is kept and shown; the project is the namespace's binding
(a namespace is bound to one project, so every LocalQueue name there maps to it)."""
GPU, GPUMEM, GPUCORES = "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"
NOT_BOUND = "CampNamespaceNotBound"
REFUSED = "CampRefused"
WAITING = "CampQueued"
GANG_WAITING = "CampGangIncomplete"


# --- namespace bindings -------------------------------------------------------------------


def namespace_bind(*, actor: User, cluster: Cluster, namespace: str, project: Project) -> NamespaceBinding:
    """Bind ``namespace`` of ``cluster`` to ``project`` (a project admin's act): the namespace is
    labelled (refused if another installation, project or Camp itself has it), Camp is granted
    its workload rights there, and the binding is recorded and audited."""
    row = NamespaceBinding(cluster=cluster, namespace=namespace, tenant=project.tenant, project=project,
                           created_by=actor)
    _require(actor, permissions.CREATE, row)
    row.full_clean(exclude=["created_by", "cluster", "tenant", "project"], validate_constraints=False)
    if cluster.backend != Backend.KUBERNETES:
        raise ValidationError({"cluster": ["Only a Kubernetes cluster's namespaces are bound."]})
    other = NamespaceBinding.objects.filter(cluster=cluster, namespace=namespace).first()
    if other is not None:
        raise ValidationError({"namespace": [
            "This namespace is bound to a project already (unbind it there first)."
            if other.project_id != project.pk else "This namespace is bound to this project already."]})
    try:
        backend_for(cluster).bind_namespace(namespace, project.pk)
    except BackendError as exc:
        raise ValidationError({"namespace": [str(exc)]}) from exc
    try:
        with transaction.atomic():
            row.save()
            audit_record(actor=actor, action="namespace.bound", target=row, tenant=project.tenant,
                         project=project, after={"cluster": cluster.name, "namespace": namespace})
    except IntegrityError as exc:
        raise ValidationError({"namespace": ["This namespace is bound to a project already."]}) from exc
    return row


def namespace_unbind(*, actor: User, binding: NamespaceBinding) -> None:
    """Unbind: no pod of the namespace is admitted any more (its queued external jobs are
    cancelled, their pods left as they are, never bound); running pods are left alone."""
    _require(actor, permissions.DELETE, binding)
    with transaction.atomic():
        audit_record(actor=actor, action="namespace.unbound", target=binding, tenant=binding.tenant,
                     project=binding.project,
                     before={"cluster": binding.cluster.name, "namespace": binding.namespace})
        binding.delete()
    for job_id in Job.objects.filter(cluster=binding.cluster, kind=EXTERNAL_KIND, state=JobState.QUEUED,
                                     namespace=binding.namespace).values_list("pk", flat=True):
        job_terminate(job_id=job_id, by=actor.get_username(),
                      reason=f"Namespace {binding.namespace} was unbound from the project; not admitted")


# --- PriorityClass → Camp class -------------------------------------------------------------


def external_priority(cluster: Cluster, kube_priority_class: str) -> str:
    """Camp's priority class for a pod of ``cluster`` with this ``spec.priorityClassName``: the
    platform admins' table (``PriorityClassMapping``); without a row, a Camp class of the same
    name (a cluster may define PriorityClasses named like Camp's); otherwise normal."""
    if kube_priority_class:
        rows = PriorityClassMapping.objects.filter(cluster=cluster, kube_priority_class=kube_priority_class)
        mapped = rows.values_list("priority_class", flat=True).first()
        if mapped:
            return str(mapped)
        if kube_priority_class in PRIORITY_VALUES:
            return kube_priority_class
    return str(PriorityClass.NORMAL)


def priority_mapping_set(*, actor: User, cluster: Cluster, kube_priority_class: str,
                         priority_class: str) -> PriorityClassMapping:
    """Map a PriorityClass of ``cluster`` to one of Camp's classes (platform admins; a second
    call for the same PriorityClass changes its class). Applies to pods queued from then on."""
    with transaction.atomic():
        row = (PriorityClassMapping.objects.select_for_update()
               .filter(cluster=cluster, kube_priority_class=kube_priority_class).first())
        before = {"priority_class": row.priority_class} if row is not None else None
        if row is None:
            row = PriorityClassMapping(cluster=cluster, kube_priority_class=kube_priority_class,
                                       created_by=actor)
        _require(actor, permissions.CHANGE if row.pk else permissions.CREATE, row)
        row.priority_class = priority_class
        row.full_clean(exclude=["cluster", "created_by"], validate_constraints=False)
        row.save()
        audit_record(actor=actor, action="priority_mapping.set", target=row, before=before,
                     after={"cluster": cluster.name, "kube_priority_class": kube_priority_class,
                            "priority_class": priority_class})
    return row


def priority_mapping_delete(*, actor: User, mapping: PriorityClassMapping) -> None:
    """Remove a row: that PriorityClass's pods follow the default rule again."""
    _require(actor, permissions.DELETE, mapping)
    with transaction.atomic():
        audit_record(actor=actor, action="priority_mapping.deleted", target=mapping,
                     before={"cluster": mapping.cluster.name,
                             "kube_priority_class": mapping.kube_priority_class,
                             "priority_class": mapping.priority_class})
        mapping.delete()


# --- external pods --------------------------------------------------------------------------


def _quantity(value: Any) -> float:
    try:
        return float(parse_quantity(str(value)))
    except (ValueError, TypeError):
        return 0.0


def pod_ask(pod: Any) -> dict[str, Any]:
    """A pod's ask as a pod group's fields: GPUs, memory per GPU (MiB) and cores (%) from the
    ``nvidia.com/gpu``/``gpumem``/``gpucores`` limits (HAMi's names), CPU and memory from the
    requests (else the limits), summed over its containers."""
    gpus = mem = cores = cpu = ram = 0.0
    for c in pod.spec.containers or []:
        res = c.resources
        limits = (res.limits if res else None) or {}
        requests = (res.requests if res else None) or {}
        gpus += _quantity(limits.get(GPU, requests.get(GPU, 0)))
        mem = max(mem, _quantity(limits.get(GPUMEM, 0)))
        cores = max(cores, _quantity(limits.get(GPUCORES, 0)))
        cpu += _quantity(requests.get("cpu", limits.get("cpu", 0))) * 1000
        ram += _quantity(requests.get("memory", limits.get("memory", 0))) / 2**20
    image = (pod.spec.containers or [None])[0]
    return {"gpu_count": int(gpus), "gpu_memory_mib": int(mem) if gpus else 0,
            "gpu_cores_percent": int(cores) if gpus else 0, "cpu_millicores": int(cpu),
            "ram_mib": int(ram), "image": (image.image if image is not None else "")[:255]}


def pod_group_of(pod: Any) -> str:
    """The gang a pod belongs to ("" for none)."""
    meta = pod.metadata
    return ((meta.labels or {}).get(POD_GROUP_LABEL)
            or (meta.annotations or {}).get(VOLCANO_GROUP_ANNOTATION) or "")


def _min_member(pods: list[Any]) -> int:
    for p in pods:
        for key in MIN_MEMBER_ANNOTATIONS:
            raw = (p.metadata.annotations or {}).get(key, "")
            if str(raw).isdigit() and int(raw) > 0:
                return int(raw)
    return len(pods)


def _job_name(base: str, uid: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:30].strip("-") or "pod"
    return f"{slug}-{hashlib.sha256(uid.encode()).hexdigest()[:8]}"


def _condition(pod: Any) -> Any:
    return next((c for c in (pod.status.conditions if pod.status else None) or []
                 if c.type == "PodScheduled"), None)


def _tell(backend: Any, pod: Any, reason: str, message: str) -> None:
    """The pod's condition follows the message; an Event only when the reason changes (a
    queued job's words change as the queue moves: one Event, not one per cycle)."""
    said = _condition(pod)
    if said is not None and said.reason == reason and (said.message or "") == message[:1000]:
        return
    event = said is None or said.reason != reason
    try:
        backend.tell_pod(pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, reason, message,
                         event=event)
    except BackendError as exc:
        logger.info("could not tell pod %s/%s why: %s", pod.metadata.namespace, pod.metadata.name, exc)


def external_pods_sync(*, cluster: Cluster) -> dict[str, int]:
    """One pass over the cluster's waiting pods that name Camp's scheduler (module doc).
    Returns counts by outcome, for logs and tests."""
    counts = {"queued": 0, "refused": 0, "unbound": 0, "waiting": 0, "gone": 0}
    if cluster.backend != Backend.KUBERNETES or not cluster.enabled:
        return counts
    backend = backend_for(cluster)
    waiting = backend.list_waiting_external_pods()
    bindings = {b.namespace: b for b in NamespaceBinding.objects.filter(cluster=cluster)
                .select_related("project", "project__tenant", "created_by")}
    # Both sides keep consenting: a namespace whose labels the cluster's side removed is
    # not bound any more (its pods are left alone and not admitted).
    bindings = {ns: b for ns, b in bindings.items() if backend.namespace_still_bound(ns, b.project_id)}
    known = dict(ExternalPod.objects.filter(cluster=cluster).values_list("uid", "job_id"))
    admitted_jobs = _queue_jobs_sync(backend, cluster, bindings, waiting, counts)
    gangs: dict[tuple[str, str], list[Any]] = {}
    for pod in waiting:
        meta = pod.metadata
        if meta.deletion_timestamp:
            continue
        if meta.uid in known or _owner_uid(pod) in admitted_jobs:
            continue  # a Job's pods belong to its Camp job (adopted when it is dispatched)
        binding = bindings.get(meta.namespace)
        if binding is None:
            counts["unbound"] += 1
            _tell(backend, pod, NOT_BOUND, (
                f"Namespace {meta.namespace} is not bound to a Camp project: a project admin binds "
                "it (Camp's API: namespace bindings) before Camp schedules its pods; "
                "never bound until then"))
            continue
        group = pod_group_of(pod)
        gangs.setdefault((meta.namespace, group or f"pod:{meta.uid}"), []).append(pod)
    for (namespace, key), pods in gangs.items():
        pods.sort(key=lambda p: p.metadata.name)
        group = "" if key.startswith("pod:") else key
        need = _min_member(pods) if group else 1
        if len(pods) < need:
            counts["waiting"] += len(pods)
            for p in pods:
                _tell(backend, p, GANG_WAITING, f"Pod group {group}: {len(pods)} of its {need} pods "
                                                f"exist; Camp queues the group once all do")
            continue
        outcome = _queue(backend, cluster, bindings[namespace], group, pods)
        counts[outcome] += len(pods)
    counts["gone"] = _forget_gone(backend, cluster, {p.metadata.uid for p in waiting})
    _tell_reasons(backend, cluster, {p.metadata.uid: p for p in waiting})
    return counts


def _queue(backend: Any, cluster: Cluster, binding: NamespaceBinding, group: str, pods: list[Any]) -> str:
    """Submit the pods as one external job of the binding's project (as the admin who bound the
    namespace); a refusal is written on the pods."""
    first = pods[0]
    asks = [pod_ask(p) for p in pods]
    if any(a != asks[0] for a in asks[1:]):
        for p in pods:
            _tell(backend, p, REFUSED, f"Pod group {group}: Camp takes gangs of identical pods only "
                                       "(one shape of resources and image); never bound")
        return "refused"
    priority = external_priority(cluster, first.spec.priority_class_name or "")
    actor = binding.created_by
    try:
        if actor is None:
            raise PermissionDenied("The admin who bound this namespace is gone; bind it again.")
        with transaction.atomic():
            job = job_submit(
                actor=actor, project=binding.project, cluster=cluster,
                name=_job_name(group or first.metadata.name, first.metadata.uid), kind=EXTERNAL_KIND,
                groups=[{"name": "pod", "replicas": len(pods), **asks[0]}], gang=True,
                priority_class=priority)
            Job.objects.filter(pk=job.pk).update(namespace=binding.namespace)
            ExternalPod.objects.bulk_create([ExternalPod(
                job=job, cluster=cluster, namespace=p.metadata.namespace, name=p.metadata.name,
                uid=p.metadata.uid, replica=i, pod_group=group,
                service_account=p.spec.service_account_name or "",
                owner_kind=next((o.kind for o in p.metadata.owner_references or []), ""),
                owner_name=next((o.name for o in p.metadata.owner_references or []), ""),
            ) for i, p in enumerate(pods)])
    except (ValidationError, PermissionDenied) as exc:
        said = _said(exc)
        for p in pods:
            _tell(backend, p, REFUSED, f"Camp refuses it for project {binding.project.name}: {said}; "
                                       "never bound"[:1000])
        return "refused"
    return "queued"


def _owner_uid(pod: Any) -> str:
    return next((o.uid for o in pod.metadata.owner_references or [] if o.kind == "Job"), "")


def _job_finished(kj: Any) -> bool:
    return _job_end(kj) is not None


def _job_end(kj: Any) -> str | None:
    """How a Job ended, as its controller says (``"completed"``, ``"failed (BackoffLimitExceeded:
    Job has reached the specified backoff limit)"``), or None while it has not."""
    for c in (kj.status.conditions if kj.status else None) or []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            if c.type == "Complete":
                return "completed"
            why = ": ".join(p for p in (c.reason, c.message) if p)
            return f"failed ({why})" if why else "failed"
    return None


def _job_width(kj: Any) -> int:
    """How many pods of a Job run at once from now: its parallelism (1 unset), at most the
    completions it still needs (``completions`` − succeeded); a Job without ``completions`` (a
    work queue) needs none once one pod has succeeded."""
    width = kj.spec.parallelism if kj.spec.parallelism is not None else 1
    succeeded = int((kj.status.succeeded if kj.status else None) or 0)
    if kj.spec.completions is not None:
        width = min(width, kj.spec.completions - succeeded)
    elif succeeded:
        width = 0
    return max(0, int(width))


def _names_camp(kj: Any) -> str:
    """The scheduler a Job's pods name ("" for Camp's own)."""
    spec = kj.spec.template.spec if kj.spec and kj.spec.template else None
    named = (spec.scheduler_name if spec is not None else None) or "default-scheduler"
    return "" if named == scheduler_name() else named


def _tell_job(backend: Any, row: ExternalWorkload, reason: str, message: str) -> None:
    """A Warning Event on the Job when what Camp says of it changes (not once per pass)."""
    said = f"{reason}: {message}"[:500]
    if row.told == said:
        return
    try:
        backend.tell_job(row.namespace, row.name, row.uid, reason, message)
    except BackendError as exc:
        logger.info("could not tell Job %s/%s why: %s", row.namespace, row.name, exc)
        return
    row.told = said
    if row.pk:
        ExternalWorkload.objects.filter(pk=row.pk).update(told=said)


def _saved(row: ExternalWorkload) -> bool:
    """Record a row Camp has something to say of (False if another pass did meanwhile)."""
    if row.pk:
        return True
    try:
        with transaction.atomic():
            row.save()
    except IntegrityError:
        return False
    return True


def _queue_jobs_sync(backend: Any, cluster: Cluster, bindings: dict[str, NamespaceBinding],
                     waiting: list[Any], counts: dict[str, int]) -> set[str]:
    """Kueue-style admission of ``batch/v1`` Jobs labelled for a queue (``QUEUE_LABELS``) whose
    pods name Camp's scheduler (the chart's webhook names it at creation): a new one in a bound
    namespace becomes an external job of ``_job_width`` pods (a gang), suspended until admitted
    (the webhook suspends it at creation; one that slipped past it is suspended here, as
    Kueue's reconciler does); the dispatch un-suspends it and binds the pods its controller then
    makes. A queued job follows the Job's width (a requeued one needs only what is left); a Job
    whose Camp job succeeded or failed while it still makes pods (further completions, a retry)
    is queued again; a cancelled one stays suspended. A Job whose pods name another scheduler is
    not Camp's: left alone (told why, in a bound namespace). Returns the UIDs of the Jobs whose
    pods are Camp's to adopt (the pod pass leaves them alone)."""
    try:
        found = backend.list_queue_jobs(QUEUE_LABELS)
    except BackendError as exc:
        if exc.status != 403:
            raise
        # an agent role from before Jobs were admitted (no ``list jobs``): its pods still are
        logger.info("cluster %s: Camp may not list Jobs (upgrade the camp-agent chart): %s", cluster, exc)
        return set()
    listed = {kj.metadata.uid: kj for kj in found if not kj.metadata.deletion_timestamp}
    rows = {w.uid: w for w in ExternalWorkload.objects.filter(cluster=cluster).select_related("job")}
    waiting_of: dict[str, int] = {}
    for pod in waiting:
        if not pod.metadata.deletion_timestamp and _owner_uid(pod):
            waiting_of[_owner_uid(pod)] = waiting_of.get(_owner_uid(pod), 0) + 1
    handled: set[str] = set()
    for uid, kj in listed.items():
        meta = kj.metadata
        row = rows.get(uid) or ExternalWorkload(
            cluster=cluster, namespace=meta.namespace, name=meta.name, uid=uid,
            queue_name=next(((meta.labels or {})[k] for k in QUEUE_LABELS if k in (meta.labels or {})),
                            "")[:253])
        binding = bindings.get(meta.namespace)
        other = _names_camp(kj)
        if other:
            # not Camp's to bind (kube-scheduler or another would race it for the pods): said
            # once in a bound namespace, nothing elsewhere (a namespace Kueue itself manages)
            if binding is not None and row.job_id is None and _saved(row):
                _tell_job(backend, row, REFUSED, (
                    f"Its pods name the scheduler {other!r}: Camp admits Jobs whose pods name "
                    f"{scheduler_name()!r} (the camp-agent chart's job webhook sets it at creation); "
                    "left alone"))
            continue
        if binding is None:
            if row.job_id is None and not _job_finished(kj) and _saved(row):
                counts["unbound"] += 1
                _tell_job(backend, row, NOT_BOUND, (
                    f"Namespace {meta.namespace} is not bound to a Camp project: a project admin binds "
                    "it (Camp's API: namespace bindings) before Camp admits its Jobs"))
            continue
        handled.add(uid)
        job = row.job
        if _job_finished(kj):
            continue
        if job is None or (job.state in (JobState.SUCCEEDED, JobState.FAILED) and not kj.spec.suspend
                           and waiting_of.get(uid)):
            # new, or its pods ended while the Job still makes more: a (new) Camp job
            width = _job_width(kj) if job is None else min(_job_width(kj), waiting_of[uid])
            counts[_queue_job(backend, cluster, binding, row, kj, width)] += 1
            continue
        if job.state == JobState.QUEUED:
            _follow_width(job, _job_width(kj), row)
            _tell_job(backend, row, WAITING, f"Camp job {job.pk}: {job.reason or 'queued'}")
        elif job.state in (JobState.REJECTED, JobState.FAILED, JobState.CANCELLED):
            if job.state == JobState.CANCELLED and not kj.spec.suspend:
                with contextlib.suppress(BackendError):  # its stop's suspend failed: again
                    backend.suspend_job(meta.namespace, meta.name, uid, True)
            if kj.spec.suspend:
                _tell_job(backend, row, REFUSED, f"Camp job {job.pk} {job.state} ({job.reason}); the Job "
                                                 "stays suspended (delete it, or create it again)")
    for uid, row in rows.items():
        kj = listed.get(uid)
        if row.job is not None and row.job.state == JobState.QUEUED and (kj is None or _job_finished(kj)):
            job_terminate(job_id=row.job.pk, reason=(
                f"Its Job {row.namespace}/{row.name} was deleted" if kj is None
                else f"Its Job {row.namespace}/{row.name} {_job_end(kj)}")[:500])
        elif row.job is None and kj is None:
            row.delete()  # what was told of a Job that is gone
    return handled


def _follow_width(job: Job, width: int, row: ExternalWorkload) -> None:
    """A queued job asks for the pods its Job will make (after a preemption, what is left of
    its completions); none left: the job ends. Only while it is queued (its row locked); the
    lock is taken only when the size differs (each pass reads every queued Job's size)."""
    if job.groups.filter(replicas=width).exists():
        return
    with transaction.atomic():
        locked = Job.objects.select_for_update().filter(pk=job.pk, state=JobState.QUEUED).first()
        group = locked.groups.first() if locked is not None else None
        if group is None or group.replicas == width:
            return
        if width > 0:
            type(group).objects.filter(pk=group.pk).update(replicas=width)
            return
    job_terminate(job_id=job.pk, reason=f"Its Job {row.namespace}/{row.name} needs no more pods")


def _queue_job(backend: Any, cluster: Cluster, binding: NamespaceBinding, row: ExternalWorkload,
               kj: Any, width: int) -> str:
    """Submit a labelled Job as one external job of ``width`` identical pods (its pod template),
    suspending it first if it runs; a refusal is an Event on the Job."""
    meta = kj.metadata
    if not kj.spec.suspend:
        try:
            backend.suspend_job(meta.namespace, meta.name, meta.uid, True)
        except BackendError as exc:
            logger.info("could not suspend Job %s/%s: %s", meta.namespace, meta.name, exc)
            return "waiting"
    template = kj.spec.template
    ask = pod_ask(template)
    actor = binding.created_by
    before = row.job_id
    try:
        if actor is None:
            raise PermissionDenied("The admin who bound this namespace is gone; bind it again.")
        if width < 1:
            raise ValidationError({"parallelism": ["The Job runs no pod (parallelism 0)."]})
        with transaction.atomic():
            same = {"job_id": before} if before is not None else {"job__isnull": True}
            if row.pk and not ExternalWorkload.objects.select_for_update().filter(pk=row.pk, **same).exists():
                return "waiting"  # another pass queued it meanwhile
            job = job_submit(
                actor=actor, project=binding.project, cluster=cluster,
                name=_job_name(meta.name, f"{meta.uid}/{before or 0}"), kind=EXTERNAL_KIND,
                groups=[{"name": "pod", "replicas": width, **ask}], gang=True,
                priority_class=external_priority(cluster, template.spec.priority_class_name or ""))
            Job.objects.filter(pk=job.pk).update(namespace=binding.namespace)
            row.job = job
            row.told = ""
            row.save()
    except IntegrityError:
        return "waiting"  # another pass recorded this Job meanwhile
    except (ValidationError, PermissionDenied) as exc:
        if _saved(row):
            _tell_job(backend, row, REFUSED, f"Camp refuses it for project {binding.project.name}: "
                                             f"{_said(exc)}; not admitted")
        return "refused"
    _tell_job(backend, row, WAITING, f"Camp job {job.pk}: queued")
    return "queued"


def _said(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and hasattr(exc, "message_dict"):
        return "; ".join(" ".join(v) if k == "__all__" else f"{k}: {' '.join(v)}"
                         for k, v in exc.message_dict.items())
    if isinstance(exc, ValidationError):
        return " ".join(exc.messages)
    return str(exc)


def _forget_gone(backend: Any, cluster: Cluster, waiting: set[str]) -> int:
    """Queued external jobs whose pod was deleted before Camp bound it: cancelled."""
    gone = 0
    rows = (ExternalPod.objects.filter(cluster=cluster, job__state=JobState.QUEUED).exclude(uid__in=waiting)
            .exclude(job__external_workloads__isnull=False))  # a Job's pods come and go with it
    for e in rows:
        try:
            exists = backend.external_pod_exists(e.namespace, e.name, e.uid)
        except BackendError:
            continue
        why = f"Its pod {e.namespace}/{e.name} was deleted"
        if not exists and job_terminate(job_id=e.job_id, reason=why):
            gone += 1
    return gone


def _tell_reasons(backend: Any, cluster: Cluster, waiting: dict[str, Any]) -> None:
    """Each waiting pod of a queued or rejected external job says why, on the pod."""
    rows = (ExternalPod.objects.filter(cluster=cluster, uid__in=list(waiting),
                                       job__state__in=(JobState.QUEUED, JobState.REJECTED))
            .select_related("job"))
    for e in rows:
        job = e.job
        if job.state == JobState.REJECTED:
            _tell(backend, waiting[e.uid], REFUSED, f"Camp job {job.pk}: {job.reason}; never bound")
        else:
            _tell(backend, waiting[e.uid], WAITING, f"Camp job {job.pk}: {job.reason or 'queued'}")


def external_jobs_of(pods: Iterable[ExternalPod]) -> list[dict[str, Any]]:
    """What the API shows of an external job's Kubernetes side."""
    return [{"namespace": e.namespace, "name": e.name, "uid": e.uid, "owner_kind": e.owner_kind,
             "owner_name": e.owner_name, "service_account": e.service_account,
             "pod_group": e.pod_group} for e in pods]
