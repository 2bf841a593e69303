"""Jobs: validation and submission (one or many), cancel, terminate, evict, checkpoint records."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F

from tenants import permissions
from tenants.audit import audit_batch, snapshot
from tenants.models import Project, User

from ..models import (
    NON_PREEMPTIBLE_CLASSES,
    PRIORITY_VALUES,
    Allocation,
    Cluster,
    GpuDevice,
    GpuSlice,
    Job,
    JobState,
    PodGroup,
    PriorityClass,
    SchedulingDecision,
    preemptible_default,
)
from .common import (
    SCHEDULER,
    _audit_job,
    _locked_job,
    _record_all,
    _require,
    _send_after_commit,
    request_cycle,
)
from .lifecycle import TRANSITIONS, transition

JOB_FIELDS = ("name", "kind", "priority_class", "priority", "preemptible", "checkpoint_capable",
              "gang", "mixed_gpu_models", "affinity", "duration_seconds", "state", "reason", "floating",
              "cluster_choice")
GROUP_FIELDS = ("name", "replicas", "gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive",
                "gpu_models", "cpu_millicores", "ram_mib", "image", "command", "env")


# --- who may use which priority class -------------------------------------------------------

# The job kind of a model service's replicas: the only kind that may run as ``inference``.
SERVICE_JOB_KIND = "service"
# What a direct submit counts as for the rule, whatever kind it names.
DIRECT_SUBMIT_KIND = ""


def priority_class_refusal(actor: User, project: Project, kind: str, priority_class: str) -> str | None:
    """Why ``actor`` may not run a ``kind`` job of ``project`` at ``priority_class`` (None: may).

    ``inference`` preempts everything and is never preempted: model services only (whoever
    may create one). ``high``
    preempts colleagues' ``normal`` work: project admins and above (``change`` on the
    project, which a project-scoped or read-only token narrows like every other right).
    ``normal`` and ``batch``: whoever may submit. One rule for every kind, bulk included
    (``_job_build``), and for a workload's own priority class before it is saved."""
    if priority_class == PriorityClass.INFERENCE and kind != SERVICE_JOB_KIND:
        return "inference is for model services only."
    if priority_class == PriorityClass.HIGH and not permissions.can(actor, permissions.CHANGE, project):
        return f"{priority_class} is for project admins and above; use normal or batch."
    return None


def require_priority_class(actor: User, project: Project, kind: str, priority_class: str) -> None:
    refusal = priority_class_refusal(actor, project, kind, priority_class)
    if refusal is not None:
        raise ValidationError({"priority_class": [refusal]})


# --- jobs ----------------------------------------------------------------------------------


def _clean_group(n: int, data: dict[str, Any]) -> PodGroup:
    unknown = set(data) - set(GROUP_FIELDS)
    if unknown:
        raise ValidationError({f"groups[{n}]": [f"Unknown field(s): {', '.join(sorted(unknown))}."]})
    group = PodGroup(**data)
    try:
        group.full_clean(exclude=["job"], validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError({f"groups[{n}].{k}": v for k, v in exc.message_dict.items()}) from exc
    if group.gpu_count == 0 and (group.gpu_memory_mib or group.gpu_cores_percent):
        raise ValidationError({f"groups[{n}].gpu_count": ["A GPU slice needs gpu_count ≥ 1."]})
    if not isinstance(group.gpu_models, list) or not all(isinstance(m, str) for m in group.gpu_models):
        raise ValidationError({f"groups[{n}].gpu_models": ["A list of GPU model names."]})
    return group


def _job_build(
    *,
    actor: User,
    project: Project,
    cluster: Cluster | None = None,
    cluster_choice: dict[str, Any] | None = None,
    name: str,
    groups: list[dict[str, Any]],
    kind: str = "batch",
    priority_class: str = PriorityClass.NORMAL,
    preemptible: bool | None = None,
    checkpoint_capable: bool = False,
    gang: bool = True,
    duration_seconds: int | None = None,
    mixed_gpu_models: bool = False,
    affinity: str = "none",
    choice_context: Any = None,
    refuse_unrunnable: bool = True,
) -> tuple[Job, list[PodGroup]]:
    """A validated, unsaved job and its pod groups (the rules of a submit, without writes).

    ``cluster`` None makes a floating job: it waits in the global queue until the placement
    step (services/placement.py) binds it to one of the clusters ``cluster_choice`` allows.
    A pinned job whose image or GPU models no node of its cluster has is refused
    (``runnable.refuse_never_runs_on``), as a floating one is (``clean_choice``), unless
    ``refuse_unrunnable`` is False: a later run of a workload accepted before (its cycle then
    rejects it with its reason, rather than failing the autoscaler or a retry)."""
    if priority_class not in PRIORITY_VALUES:
        raise ValidationError({"priority_class": [f"Choose one of: {', '.join(PRIORITY_VALUES)}."]})
    if preemptible is None:
        preemptible = preemptible_default(priority_class)
    if preemptible and priority_class in NON_PREEMPTIBLE_CLASSES:
        raise ValidationError({"preemptible": [f"{priority_class} jobs are never preemptible."]})
    job = Job(
        tenant=project.tenant, project=project, owner=actor, cluster=cluster, name=name, kind=kind,
        priority_class=priority_class, priority=PRIORITY_VALUES[priority_class],
        preemptible=preemptible, checkpoint_capable=checkpoint_capable, gang=gang,
        mixed_gpu_models=mixed_gpu_models, duration_seconds=duration_seconds, affinity=affinity,
    )
    _require(actor, permissions.CREATE, job)
    if refuse_unrunnable:
        # A direct submit (the jobs API, bulk): never a model service's replica, whatever
        # ``kind`` it claims (services submit theirs as runs of the workload, which checked
        # its class when it was created or changed and keeps it for later runs).
        require_priority_class(actor, project, DIRECT_SUBMIT_KIND, priority_class)
    if cluster is not None and not cluster.enabled:
        raise ValidationError({"cluster": ["This cluster is disabled."]})
    if cluster is not None and cluster_choice:
        raise ValidationError({"cluster_choice": [
            "Name one cluster or give a cluster choice (clusters, labels), not both."]})
    if not groups:
        raise ValidationError({"groups": ["A job needs at least one pod group."]})
    if cluster is None:
        from .placement import clean_choice  # placement reaches the cycle, which imports this module

        job.floating = True
        job.cluster_choice = clean_choice(cluster_choice, groups, project, choice_context)
    rows = [_clean_group(n, g) for n, g in enumerate(groups)]
    if len({g.name for g in rows}) != len(rows):
        raise ValidationError({"groups": ["Pod group names must be distinct."]})
    if sum(g.replicas for g in rows) > 256:
        raise ValidationError({"groups": ["At most 256 pods per job."]})
    if cluster is not None and refuse_unrunnable:
        from .runnable import refuse_never_runs_on

        refuse_never_runs_on(cluster, groups, project, choice_context)
    try:
        job.full_clean(exclude=["owner", "tenant", "project", "cluster"], validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    return job, rows


def _job_submitted(actor: User, job: Job, rows: list[PodGroup]) -> SchedulingDecision:
    """The history row and audit event of a submitted job (its rows saved; the lifecycle's
    ``submit`` row: created QUEUED, the model's default state); the decision is returned
    unsaved so that bulk submits insert them together."""
    submit = TRANSITIONS["submit"]
    _audit_job(submit.audit, job, actor=actor, after={
        **snapshot(job, JOB_FIELDS), "groups": [snapshot(g, GROUP_FIELDS) for g in rows]})
    return SchedulingDecision(job=job, cluster_id=job.cluster_id, kind=submit.decision,
                              reason="Queued; waiting for the next scheduling cycle")


@transaction.atomic
def job_submit(
    *,
    actor: User,
    project: Project,
    cluster: Cluster | None = None,
    cluster_choice: dict[str, Any] | None = None,
    name: str,
    groups: list[dict[str, Any]],
    kind: str = "batch",
    priority_class: str = PriorityClass.NORMAL,
    preemptible: bool | None = None,
    checkpoint_capable: bool = False,
    gang: bool = True,
    duration_seconds: int | None = None,
    mixed_gpu_models: bool = False,
    affinity: str = "none",
    refuse_unrunnable: bool = True,
) -> Job:
    """Queue a job (state QUEUED) and ask for a scheduling cycle after commit (requests
    coalesce per cluster: ``request_cycle``); a floating job (no ``cluster``) asks for a
    placement step instead.

    The audit event is appended as the transaction's last statement (``audit_batch``): the
    chain lock every writer of the audit log queues on is then held only for that insert
    and the commit, not for the rest of the submit."""
    job, rows = _job_build(
        actor=actor, project=project, cluster=cluster, cluster_choice=cluster_choice, name=name,
        groups=groups, kind=kind,
        priority_class=priority_class, preemptible=preemptible,
        checkpoint_capable=checkpoint_capable, gang=gang, duration_seconds=duration_seconds,
        mixed_gpu_models=mixed_gpu_models, affinity=affinity, refuse_unrunnable=refuse_unrunnable)
    with audit_batch():
        # No savepoint of its own: a taken name ends this function's transaction (or, nested,
        # its savepoint) with the ValidationError, and nothing runs in it after the failure.
        try:
            job.save()
        except IntegrityError as exc:
            raise ValidationError({"name": ["This project already has a job with this name."]}) from exc
        for g in rows:
            g.job = job
        PodGroup.objects.bulk_create(rows)
        decision = _job_submitted(actor, job, rows)
        decision.save()
        _request_for(job.cluster_id)
    _known_relations(job, groups=rows, allocations=[], decisions=[decision])
    return job


def _known_relations(job: Job, **related: list[Any]) -> None:
    """Give a job just written the rows of its relations it was written with, as a
    ``prefetch_related`` would (``job.groups.all()`` then reads no row): the submit's answer
    is built without reading back its pod groups, allocations (none yet) and decision."""
    cache = job.__dict__.setdefault("_prefetched_objects_cache", {})
    for name, rows in related.items():
        qs = getattr(job, name).all()
        qs._result_cache = list(rows)
        qs._prefetch_done = True
        cache[name] = qs


def _request_for(cluster_id: int | None) -> None:
    """A cycle of the job's cluster, or for a floating job not placed yet, a placement step."""
    if cluster_id is not None:
        request_cycle(cluster_id)
    else:
        from .placement import request_placement

        request_placement()


MAX_BULK_JOBS = 1000
"""Jobs per bulk submit (a sweep larger than this is sent in several requests)."""


def job_submit_many(*, actor: User, jobs: list[dict[str, Any]]) -> list[Job]:
    """Queue many jobs at once, all or nothing (parameter sweeps).

    Each item takes ``job_submit``'s arguments (without ``actor``) and is checked by the
    same rules; every problem is reported, keyed ``jobs[<index>].<field>``, and then
    nothing is written. Otherwise jobs, pod groups, decisions and audit events are
    inserted in bulk in one transaction, and one cycle is requested per cluster."""
    if not jobs:
        raise ValidationError({"jobs": ["Submit at least one job."]})
    if len(jobs) > MAX_BULK_JOBS:
        raise ValidationError({"jobs": [f"At most {MAX_BULK_JOBS} jobs per request."]})
    errors: dict[str, list[str]] = {}
    built: list[tuple[Job, list[PodGroup]]] = []
    seen: dict[tuple[int, str], int] = {}
    from .placement import ChoiceContext  # placement reaches the cycle, which imports this module

    context = ChoiceContext()  # floating jobs: clusters and image architectures read once
    for i, item in enumerate(jobs):
        try:
            job, rows = _job_build(actor=actor, **item, choice_context=context)
        except ValidationError as exc:
            for field_name, msgs in exc.message_dict.items():
                errors[f"jobs[{i}].{field_name}"] = list(msgs)
            continue
        key = (job.project_id, job.name)
        if key in seen:
            errors[f"jobs[{i}].name"] = [f"Also the name of jobs[{seen[key]}] in this project."]
            continue
        seen[key] = i
        built.append((job, rows))
    taken = set(Job.objects.filter(project_id__in={p for p, _ in seen}, name__in={n for _, n in seen})
                .values_list("project_id", "name"))
    for (project_id, name), i in seen.items():
        if (project_id, name) in taken:
            errors[f"jobs[{i}].name"] = ["This project already has a job with this name."]
    if errors:
        raise ValidationError(errors)
    with transaction.atomic(), audit_batch():
        try:
            with transaction.atomic():
                Job.objects.bulk_create([job for job, _ in built], batch_size=500)
        except IntegrityError as exc:  # a job of the same name committed meanwhile
            raise ValidationError({"jobs": ["A job name was taken meanwhile; submit again."]}) from exc
        for job, rows in built:
            for g in rows:
                g.job = job
        PodGroup.objects.bulk_create([g for _, rows in built for g in rows], batch_size=500)
        _record_all([_job_submitted(actor, job, rows) for job, rows in built])
        for cluster_id in {job.cluster_id for job, _ in built}:
            _request_for(cluster_id)
    return [job for job, _ in built]


def job_cancel(*, actor: User, job: Job) -> Job:
    """Cancel a job: a queued one at once; an admitted one once its pods are gone."""
    with transaction.atomic():
        locked = Job.objects.select_for_update(no_key=True).get(pk=job.pk)
        _require(actor, permissions.DELETE, locked)
        if locked.is_final:
            raise ValidationError({"state": [f"The job is already {locked.get_state_display().lower()}."]})
        transition(locked, "cancel", reason=f"Cancelled by {actor.get_username()}", actor=actor,
                   audit={"state": JobState.CANCELLED.value})
    return locked


def job_terminate(*, job_id: int, reason: str, by: str = SCHEDULER) -> bool:
    """Cancel a job on the platform's behalf — idle culling, a maximum runtime, a failed
    dependency (workspaces/) — with ``reason`` recorded as given and ``by`` as the audit
    actor name. Like ``job_cancel`` but without a user; False if it had already ended."""
    with transaction.atomic():
        job = _locked_job(job_id)
        if job.is_final:
            return False
        return transition(job, "cancel", reason=reason, actor_username=by,
                          audit={"state": JobState.CANCELLED.value, "reason": reason[:500]})


def _stop_after_commit(job_id: int) -> None:
    _send_after_commit("job_stop", job_id)


def job_evict(*, job_id: int, reason: str) -> bool:
    """Take a running job off broken hardware: stop its pods and requeue it (checkpoint-
    capable jobs resume from their latest checkpoint). Returns False if nothing to do."""
    with transaction.atomic():
        job = _locked_job(job_id)
        return transition(job, "evict", reason=f"Rescheduling: {reason}",
                          fields={"preempted_by_id": None}, audit={"reason": reason})


def job_checkpoint_record(*, job: Job, path: str, actor: User | None = None) -> Job:
    """Remember a checkpoint-capable job's latest checkpoint: when the job is preempted or
    rescheduled off broken hardware, its next pods get ``CAMP_RESUME_FROM=<path>``.
    Workloads (or the job itself) report checkpoints; ``actor`` None means the platform.

    Who may report (docs/SECURITY.md): the job's owner (while they may change it; a
    project-scoped or read-only token narrows this as everywhere), platform admins, and
    Camp itself. Not a project admin or tenant owner on someone else's job: the path
    decides what data the owner's job resumes from, and they could point it at their own.
    Every change is audited (``job.checkpointed``, before and after)."""
    path = path.strip()
    if not path or len(path) > 500:
        raise ValidationError({"path": ["A checkpoint path of 1 to 500 characters."]})
    with transaction.atomic():
        locked = _locked_job(job.pk)
        if actor is not None and not permissions.acts_as_platform_admin(actor, permissions.CHANGE):
            _require(actor, permissions.CHANGE, locked)
            if locked.owner_id != actor.pk:
                raise PermissionDenied("Only the job's owner reports its checkpoints.")
        if not locked.checkpoint_capable:
            raise ValidationError({"path": ["This job is not checkpoint-capable."]})
        before = locked.last_checkpoint
        if before != path:
            locked.last_checkpoint = path
            locked.save(update_fields=["last_checkpoint", "updated_at"])
            _audit_job("job.checkpointed", locked, actor=actor, before={"checkpoint": before},
                       after={"checkpoint": path})
    return locked


def _preempted_reason(victim: Job, preemptor: Job | None) -> str:
    """Why ``victim`` was preempted, as everyone who may see the victim reads it (its reason,
    its decisions, live pages). The preemptor is named only when it is in the victim's
    project: a job's readers may not see other projects' jobs, never other tenants'. Else
    the kind of eviction: a higher priority, or a guarantee reclaimed (the engine's two
    eligibility rules, ``engine.preemption.may_preempt``)."""
    if preemptor is None:
        return "Preempted"
    if preemptor.project_id == victim.project_id:
        return f"Preempted by job {preemptor.name} (#{preemptor.pk}, priority {preemptor.priority_class})"
    whose = "another project" if preemptor.tenant_id == victim.tenant_id else "another tenant"
    if preemptor.priority > victim.priority:
        return f"Preempted by a higher-priority job of {whose}"
    return (f"Preempted: the capacity it borrowed was reclaimed by the owner of the guaranteed "
            f"capacity ({whose})")


# --- release -------------------------------------------------------------------------------


def _release(job: Job) -> int:
    """Give back everything the job holds (call inside a transaction with the job locked)."""
    allocs = list(Allocation.objects.select_for_update(no_key=True).filter(job=job).order_by("pk"))
    if not allocs:
        return 0
    delta: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for s in GpuSlice.objects.filter(allocation__in=allocs):
        d = delta[s.gpu_id]
        d[0] += s.memory_mib
        d[1] += s.cores_percent
        d[2] += 1
        d[3] = d[3] or int(s.exclusive)
    for gpu_id in sorted(delta):
        mem, cores, n, excl = delta[gpu_id]
        changes: dict[str, Any] = {
            "memory_allocated_mib": F("memory_allocated_mib") - mem,
            "cores_allocated": F("cores_allocated") - cores,
            "sharers": F("sharers") - n,
        }
        if excl:
            changes["exclusive_held"] = False
        GpuDevice.objects.filter(pk=gpu_id).update(**changes)
    Allocation.objects.filter(pk__in=[a.pk for a in allocs]).delete()
    return len(allocs)
