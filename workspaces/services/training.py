"""Training jobs: submit, stop, delete, checkpoints reported or scanned from logs, and the
periodic sync of a training's state and usage from its run."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from registry.models import Image, Variant
from scheduling import services as scheduling
from scheduling.models import (
    Cluster,
    DecisionKind,
    Job,
    JobState,
    PriorityClass,
    SchedulingDecision,
    preemptible_default,
)
from tenants import permissions
from tenants.audit import snapshot
from tenants.models import Project, User
from tenants.permissions import restrict

from ..kinds import WorkloadKind, kind_check, kind_run, register_kind
from ..models import (
    Profile,
    TrainingCheckpoint,
    TrainingFramework,
    TrainingJob,
)
from ..pods import training_of_job, training_specs
from ..quota import refuse_if_over_storage
from .common import (
    CULLER,
    LAUNCHER,
    TRAINING_FIELDS,
    _audit,
    _clean_cluster,
    _clean_data_volume,
    _clean_env,
    _clean_shape,
    _require,
    _resolve_image,
    _save,
    enqueue_on_commit,
    refuse_unrunnable,
)
from .policies import _check_profile

# --- training jobs --------------------------------------------------------------------------


def _training_groups(t: TrainingJob) -> list[dict[str, Any]]:
    worker = {
        "name": "worker",
        "replicas": t.workers,
        "gpu_count": t.gpu_count,
        "gpu_memory_mib": t.gpu_memory_mib,
        "gpu_cores_percent": t.gpu_cores_percent,
        "exclusive": t.exclusive,
        "gpu_models": list(t.gpu_models or []),
        "cpu_millicores": t.cpu_millicores,
        "ram_mib": t.ram_mib,
        "image": t.image_reference,
        "command": [str(c) for c in t.command or []],
        "env": dict(t.env),
    }
    if not t.has_launcher:
        return [worker]
    launcher = {
        "name": "launcher",
        "replicas": 1,
        "gpu_count": 0,
        "image": t.image_reference,
        "command": [str(c) for c in t.command or []],
        "env": dict(t.env),
        **LAUNCHER,
    }
    worker["command"] = []  # workers wait for the launcher (sshd / the MPI daemon)
    return [launcher, worker]


def _training_job_options(t: TrainingJob) -> dict[str, Any]:
    return {"priority_class": t.priority_class, "preemptible": t.preemptible,
            "checkpoint_capable": bool(t.checkpoint_dir), "gang": True,
            "duration_seconds": t.duration_seconds}


TRAINING_KIND = register_kind(WorkloadKind(
    name="training", job_kinds=tuple(TrainingFramework.values), job_kind_of=lambda t: t.framework,
    groups=_training_groups, job_options=_training_job_options, row_of_job=training_of_job,
    specs=training_specs,
))


def _later_choice(t: TrainingJob) -> dict[str, Any] | None:
    """A floating job's choice for a run after the first (a retry, a release by its
    dependencies): the clusters named in it that were disabled or deleted since are left out
    (the placement step would skip them anyway); none left is a ValidationError."""
    if t.cluster is not None or not t.cluster_choice.get("clusters"):
        return None
    named = list(t.cluster_choice["clusters"])
    alive = set(Cluster.objects.filter(enabled=True, name__in=named).values_list("name", flat=True))
    if not alive:
        raise ValidationError({"cluster_choice.clusters": [
            f"None of its clusters ({', '.join(named)}) is enabled any more."]})
    return {**t.cluster_choice, "clusters": [n for n in named if n in alive]}


def _training_run(actor: User, t: TrainingJob, name: str, *, later: bool = False) -> Job:
    """Submit a run; the first is checked strictly at launch, ``later`` ones (retries,
    releases) tolerate clusters of the choice that went away meanwhile."""
    job = kind_run(TRAINING_KIND, actor=actor, row=t, name=name,
                   choice=_later_choice(t) if later else None)
    latest = t.checkpoints.order_by("-step", "-id").first() if t.pk else None
    if latest is not None:  # a retry resumes from the latest checkpoint too
        Job.objects.filter(pk=job.pk).update(last_checkpoint=latest.path)
    t.job = job
    t.blocked_reason = ""
    t.save(update_fields=["job", "blocked_reason", "updated_at"])
    return job


@transaction.atomic
def training_submit(
    *,
    actor: User,
    project: Project,
    cluster: Cluster | None = None, cluster_choice: dict[str, Any] | None = None,  # None: it floats
    name: str,
    framework: str,
    image: Image | None = None,
    image_reference: str = "",
    workers: int = 1,
    gpu_count: int = 1,
    gpu_memory_mib: int = 0,
    gpu_cores_percent: int = 0,
    exclusive: bool = False,
    gpu_models: list[str] | None = None,
    cpu_millicores: int = 4000,
    ram_mib: int = 16384,
    command: list[str] | None = None,
    env: dict[str, Any] | None = None,
    data_volume: str = "",
    checkpoint_dir: str = "",
    checkpoint_every: int = 100,
    checkpoint_volume_gib: int = 0,
    log_dir: str = "",
    max_runtime_seconds: int | None = None,
    retry_limit: int = 0,
    priority_class: str = PriorityClass.NORMAL,
    preemptible: bool | None = None,
    duration_seconds: int | None = None,
    depends_on: list[TrainingJob] | None = None,
    profile: Profile | None = None,
) -> TrainingJob:
    """Create a training job: a gang of ``workers`` (plus a launcher for DeepSpeed and MPI),
    submitted now, or once every job it depends on has succeeded. With a compute preset
    (``profile``) each worker takes the preset's shape and GPU model ("workers × preset").
    Without ``cluster`` it floats (``_clean_where``): each run goes where it starts soonest."""
    if profile is not None:
        _check_profile(actor, profile, project)
        gpu_count, gpu_memory_mib = profile.gpu_count, profile.gpu_memory_mib
        gpu_cores_percent, exclusive = profile.gpu_cores_percent, profile.exclusive
        cpu_millicores, ram_mib = profile.cpu_millicores, profile.ram_mib
        gpu_models = [profile.gpu_model] if profile.gpu_model else []
    if framework not in TrainingFramework.values:
        raise ValidationError({"framework": [f"Choose one of: {', '.join(TrainingFramework.values)}."]})
    if priority_class not in PriorityClass.values:
        raise ValidationError({"priority_class": [f"Choose one of: {', '.join(PriorityClass.values)}."]})
    if preemptible is None:
        preemptible = preemptible_default(priority_class, workload="training")
    t = TrainingJob(
        tenant=project.tenant,
        project=project,
        owner=actor,
        cluster=cluster,
        name=name,
        framework=framework,
        workers=workers,
        gpu_count=gpu_count, gpu_memory_mib=gpu_memory_mib,
        gpu_cores_percent=gpu_cores_percent, exclusive=exclusive,
        gpu_models=list(gpu_models or []),
        cpu_millicores=cpu_millicores,
        ram_mib=ram_mib,
        command=list(command or []),
        data_volume=data_volume,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        checkpoint_volume_gib=checkpoint_volume_gib,
        log_dir=log_dir,
        max_runtime_seconds=max_runtime_seconds,
        retry_limit=retry_limit,
        priority_class=priority_class,
        preemptible=preemptible,
        duration_seconds=duration_seconds,
    )
    _require(actor, permissions.CREATE, t)
    scheduling.require_priority_class(actor, project, TRAINING_KIND.job_kind_of(t), priority_class)
    _clean_training(actor, t, image=image, image_reference=image_reference, env=env, choice=cluster_choice)
    deps = _clean_depends_on(project, depends_on)
    _training_begin(actor, t, deps, profile)
    return t


@transaction.atomic
def training_stop(*, actor: User, training: TrainingJob) -> TrainingJob:
    t = (
        TrainingJob.objects.select_for_update(no_key=True, of=("self",))
        .select_related("job", "tenant", "project")
        .get(pk=training.pk)
    )
    _require(actor, permissions.CHANGE, t)
    if t.state not in ("waiting", "queued", "starting", "running"):
        raise ValidationError({"state": [f"The training job is already {t.state}."]})
    reason = f"Stopped by {actor.get_username()}"
    if t.job is not None:
        scheduling.job_terminate(job_id=t.job.pk, reason=reason, by=actor.get_username())
    t.stop_reason = reason
    t.blocked_reason = ""
    t.save(update_fields=["stop_reason", "blocked_reason", "updated_at"])
    _audit("training.stopped", t, actor=actor, after={"reason": reason})
    return t


@transaction.atomic
def training_delete(*, actor: User, training: TrainingJob) -> None:
    """Delete a training job: stop its run if it is not over, fail the jobs still waiting
    for it (a deleted dependency will never succeed), remove its checkpoint volume. The
    audit record keeps what it was; its scheduling runs stay in the job history."""
    t = (
        TrainingJob.objects.select_for_update(no_key=True, of=("self",))
        .select_related("job__cluster", "tenant", "project", "cluster")
        .get(pk=training.pk)
    )
    _require(actor, permissions.DELETE, t)
    by = actor.get_username()
    if t.job is not None and not t.job.is_final:
        scheduling.job_terminate(job_id=t.job.pk, reason=f"Deleted by {by}", by=by)
    waiting = t.dependants.filter(job__isnull=True, failed_dependency=False, stop_reason="")
    for d in waiting.select_related("tenant", "project"):
        reason = f"Dependency {t.name} was deleted; this job will not run"
        TrainingJob.objects.filter(pk=d.pk).update(failed_dependency=True, blocked_reason=reason)
        _audit("training.dependency_failed", d, actor=actor, after={"reason": reason})
    _audit(
        "training.deleted",
        t,
        actor=actor,
        before={**snapshot(t, TRAINING_FIELDS), "state": t.state, "run": t.job_id, "ran_on": _ran_on(t)},
    )
    # The checkpoint volume outlives runs (pods.py); TensorBoard objects go with the run.
    objects = [("PersistentVolumeClaim", f"tr-{t.pk}-ckpt")] if t.checkpoint_volume_gib else []
    from ..selectors import namespace_spec_for

    cluster = t.run_cluster  # a floating job's objects are where its run was placed
    ns = namespace_spec_for(t)
    t.delete()
    if objects and cluster is not None:
        enqueue_on_commit("delete_objects", cluster.pk, ns, objects)


CHECKPOINT_LINE = re.compile(r"^(?:(\S+Z) )?CAMP_CHECKPOINT step=(\d+) path=(\S+)\s*$")


def training_report_checkpoint(
    *, training: TrainingJob, step: int, path: str, at: dt.datetime | None = None, actor: User | None = None
) -> bool:
    """Record a checkpoint (idempotent per path); the next run resumes from the latest."""
    if actor is not None:
        _require(actor, permissions.CHANGE, training)
    if not path.startswith("/") or len(path) > 500:
        raise ValidationError({"path": ["An absolute path of at most 500 characters."]})
    job = training.job
    _, made = TrainingCheckpoint.objects.get_or_create(
        training=training,
        path=path,
        defaults={"step": step, "written_at": at or timezone.now(), "attempt": job.attempts if job else 0},
    )
    latest = training.checkpoints.order_by("-step", "-id").first()
    if job is not None and latest is not None and job.last_checkpoint != latest.path:
        Job.objects.filter(pk=job.pk).update(last_checkpoint=latest.path)
    return made


def _scan_checkpoints(t: TrainingJob) -> None:
    """Read rank 0's log for ``CAMP_CHECKPOINT step=<n> path=<p>`` lines (every tick: through the
    gate of periodic cluster calls, so a cluster that does not answer is skipped, not waited on;
    a disabled one still runs its jobs, so it is read)."""
    from ..selectors import job_logs

    if not t.checkpoint_dir or t.job is None:
        return
    job = t.job
    logs = scheduling.cluster_periodic("checkpoint-scan", job.placed_cluster_id,
                                       lambda _cluster: job_logs(job, tail=500), enabled_only=False)
    if isinstance(logs, str):
        return  # why it was not read ("backing-off", "unreachable" …): the next tick tries again
    for log in logs:
        if log.role != "worker" or not log.pod.endswith("-worker-0"):
            continue
        for line in log.text.splitlines():
            m = CHECKPOINT_LINE.match(line.strip())
            if m:
                at = _log_time(m.group(1)) if m.group(1) else None
                training_report_checkpoint(training=t, step=int(m.group(2)), path=m.group(3), at=at)


def _log_time(stamp: str) -> dt.datetime | None:
    """A log line's timestamp: RFC 3339 in UTC as the kubelet writes it, with nanoseconds
    (``2026-11-28T03:07:42.664896684Z``), cut to the microseconds Python keeps; None when it
    is not one (the line's checkpoint is then dated when it is read)."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    digits = (fraction or "0")[:6].ljust(6, "0")
    try:
        at = dt.datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return at.replace(microsecond=int(digits) if digits.isdigit() else 0, tzinfo=dt.UTC)


def _gpu_share(t: TrainingJob) -> float:
    """GPUs the run holds, in the one GPU unit (``engine.accounting``), its slices' memory taken
    as a share of the largest card of its models (its cards are gone once it is preempted)."""
    from scheduling.engine.accounting import shape_ask_gpus
    from scheduling.models import GpuDevice

    cards = GpuDevice.objects.all()
    if t.gpu_models:
        cards = cards.filter(model__in=list(t.gpu_models))
    card = max(cards.values_list("memory_mib", flat=True), default=0) if t.gpu_memory_mib else 0
    return shape_ask_gpus(replicas=t.workers, gpu_count=t.gpu_count, exclusive=t.exclusive,
                          memory_mib=t.gpu_memory_mib, memory_percent=0,
                          cores_percent=t.gpu_cores_percent, card_memory_mib=card)


def _account(t: TrainingJob) -> None:
    """Restarts and GPU time lost, recomputed from the runs' histories (idempotent): each
    preemption loses the GPU time since the later of the attempt's start and its last
    checkpoint before the preemption."""
    if t.job is None:
        return
    checkpoints = sorted(t.checkpoints.values_list("written_at", flat=True))
    restarts, lost = 0, 0.0
    share: float | None = None  # read once, at the first preemption
    jobs = Job.objects.filter(project=t.project, name__in=_run_names(t))
    started: dt.datetime | None = None
    for d in SchedulingDecision.objects.filter(job__in=jobs).order_by("id"):
        if d.kind == DecisionKind.STARTED:
            started = d.created_at
        elif d.kind == DecisionKind.PREEMPTED and started is not None:
            since = max([started, *[c for c in checkpoints if started <= c <= d.created_at]])
            if share is None:
                share = _gpu_share(t)
            lost += max(0.0, (d.created_at - since).total_seconds()) * share
            started = None
        elif d.kind == DecisionKind.REQUEUED:
            restarts += 1
    if (restarts, round(lost, 1)) != (t.restarts, round(t.lost_gpu_seconds, 1)):
        TrainingJob.objects.filter(pk=t.pk).update(restarts=restarts, lost_gpu_seconds=lost)
        t.restarts, t.lost_gpu_seconds = restarts, lost


def _ran_on(t: TrainingJob) -> list[str]:
    """The clusters its runs were placed on (a floating job's may differ run to run)."""
    return sorted(set(Job.objects.filter(project=t.project, name__in=_run_names(t), cluster__isnull=False)
                      .values_list("cluster__name", flat=True)))


def _run_names(t: TrainingJob) -> list[str]:
    return [t.name] + [f"{t.name[:30]}-retry{n}" for n in range(1, t.retries + 1)]


def training_sync(*, training: TrainingJob, now: dt.datetime | None = None) -> str:
    """Advance one training job: dependencies, checkpoints, accounting, maximum runtime and
    retries. Idempotent; the workspaces tick calls it for every unfinished job."""
    now = now or timezone.now()
    t = TrainingJob.objects.select_related("job", "tenant", "project", "cluster", "owner").get(pk=training.pk)
    if t.job is None:
        if t.failed_dependency or t.stop_reason:
            return "idle"
        deps = list(t.depends_on.select_related("job"))
        failed = [d for d in deps if d.state in ("failed", "stopped")]
        if failed:
            with transaction.atomic():
                reason = f"Dependency {failed[0].name} {failed[0].state}; this job will not run"
                TrainingJob.objects.filter(pk=t.pk).update(failed_dependency=True, blocked_reason=reason)
                _audit("training.dependency_failed", t, after={"reason": reason})
            return "dependency-failed"
        if all(d.state == "succeeded" for d in deps) and t.owner is not None:
            try:
                with transaction.atomic():
                    _training_run(t.owner, t, t.name, later=True)
                    _audit("training.released", t, after={"dependencies": [d.name for d in deps]})
            except ValidationError as exc:
                return _run_refused(t, exc)
            return "submitted"
        pending = ", ".join(d.name for d in deps if d.state != "succeeded")
        TrainingJob.objects.filter(pk=t.pk).update(blocked_reason=f"Waiting for {pending} to succeed")
        return "waiting"
    job = t.job
    if job.state == JobState.RUNNING:
        _scan_checkpoints(t)
        if (
            t.max_runtime_seconds
            and job.started_at
            and (now - job.started_at).total_seconds() > t.max_runtime_seconds
        ):
            with transaction.atomic():
                reason = f"Exceeded its maximum runtime of {t.max_runtime_seconds} s"
                scheduling.job_terminate(job_id=job.pk, reason=reason, by=CULLER)
                TrainingJob.objects.filter(pk=t.pk).update(stop_reason=reason)
                _audit("training.timed_out", t, after={"reason": reason})
            return "timed-out"
    _account(t)
    retry = t.retries < t.retry_limit and not t.stop_reason
    if job.state == JobState.FAILED and retry and t.owner is not None:
        try:
            with transaction.atomic():
                locked = TrainingJob.objects.select_for_update(no_key=True, of=("self",)).get(pk=t.pk)
                if locked.job_id != job.pk:
                    return "retried"
                locked.retries += 1
                locked.save(update_fields=["retries"])
                t.retries = locked.retries
                _training_run(t.owner, t, f"{t.name[:30]}-retry{t.retries}", later=True)
                _audit("training.retried", t, after={"retry": t.retries, "after": job.reason})
        except ValidationError as exc:  # the retry count went back with the run
            return _run_refused(t, exc)
        return "retried"
    return job.state


def _run_refused(t: TrainingJob, exc: ValidationError) -> str:
    """A later run that cannot be submitted (its cluster, or every cluster of its set, was
    disabled or deleted; a name taken...) ends the training job with the reason, audited,
    instead of failing every tick."""
    reason = f"Its next run could not be submitted: {' '.join(exc.messages)}"[:300]
    with transaction.atomic():
        TrainingJob.objects.filter(pk=t.pk).update(stop_reason=reason, blocked_reason=reason)
        _audit("training.run_refused", t, after={"reason": reason})
    return "refused"


def _clean_training(actor: User, t: TrainingJob, *, image: Image | None, image_reference: str,
                    env: dict[str, Any] | None, choice: Any = None) -> None:
    """Validate an unsaved training job's cluster, gang, shape and paths (each error names its
    field), then resolve its image, clean its environment onto it and check where it may run."""
    if t.cluster is not None:
        _clean_cluster(t.cluster, actor)
    if not 1 <= t.workers <= 128:
        raise ValidationError({"workers": ["Between 1 and 128 workers."]})
    _clean_shape({f: getattr(t, f) for f in ("gpu_count", "gpu_memory_mib", "gpu_cores_percent",
                                             "exclusive", "cpu_millicores", "ram_mib")})
    if t.checkpoint_dir and not t.checkpoint_dir.startswith("/"):
        raise ValidationError({"checkpoint_dir": ["An absolute path inside the container."]})
    if t.log_dir and not t.log_dir.startswith("/"):
        raise ValidationError({"log_dir": ["An absolute path inside the container."]})
    if t.checkpoint_volume_gib and not t.checkpoint_dir:
        raise ValidationError({"checkpoint_volume_gib": ["A checkpoint volume needs a checkpoint_dir."]})
    if t.data_volume:
        _clean_data_volume(actor, t.project, t.data_volume)
    t.image, t.image_reference = _resolve_image(
        project=t.project,
        image=image,
        image_reference=image_reference,
        variant=Variant.TRAINING,
        variant_label="training",
    )
    t.env = _clean_env(env)
    _clean_where(actor, t, choice)


def _clean_where(actor: User, t: TrainingJob, choice: Any) -> None:
    """One named cluster, or (``cluster`` None) a floating choice — any cluster the project may
    use, ``{"clusters": [...]}`` and/or ``{"labels": {...}}`` — checked as a raw floating job's
    is (``clean_choice``: unknown names, labels no cluster has, an image built for no allowed
    cluster's nodes), with its errors on the training job's fields. Every run is then a
    floating Job that the global queue places where it starts soonest. Cluster-bound volumes
    need one named cluster."""
    if t.cluster is not None:
        if choice and (not isinstance(choice, dict) or any(choice.values())):
            raise ValidationError({"cluster_choice": [
                "Name one cluster or give a cluster choice (clusters, labels), not both."]})
        t.cluster_choice = {}
        refuse_unrunnable(cluster=t.cluster, groups=_training_groups(t), project=t.project,
                          fields=_group_fields(t))
        return
    # A PVC lives on one cluster (a data set's is not even known to Camp), and a checkpoint
    # volume must be found by every later run (requeues, retries): refuse rather than let a
    # run land where its volume is not.
    if t.data_volume:
        raise ValidationError({"data_volume": [
            f"{t.data_volume} is a volume on one cluster: name that cluster to mount it (a training "
            f"job for any cluster, a set of clusters or labels cannot)."]})
    if t.checkpoint_volume_gib:
        raise ValidationError({"checkpoint_volume_gib": [
            "A checkpoint volume lives on one cluster and every run must find it there: name the "
            "cluster to give the job one (or write checkpoints elsewhere, e.g. object storage)."]})
    names = choice.get("clusters") if isinstance(choice, dict) else None
    if isinstance(names, list) and all(isinstance(n, str) for n in names):  # tenant isolation
        visible = set(restrict(Cluster.objects.filter(enabled=True), actor).values_list("name", flat=True))
        hidden = sorted({str(n) for n in names} - visible)
        if hidden:
            raise ValidationError({"cluster_choice.clusters": [
                f"No enabled cluster named {', '.join(hidden)}."]})
    from scheduling.services.placement import clean_choice

    fields = _group_fields(t)
    try:
        t.cluster_choice = clean_choice(choice, _training_groups(t), t.project)
    except ValidationError as exc:
        raise ValidationError({fields.get(k, k): v for k, v in exc.message_dict.items()}) from exc


def _group_fields(t: TrainingJob) -> dict[str, str]:
    """A run's pod-group error keys (``groups[i].image``, ``groups[i].gpu_models``) → the training
    job's fields (the launcher shares the workers' image)."""
    image_field = "image" if t.image is not None else "image_reference"
    return {f"groups[{i}].{k}": image_field if k == "image" else "gpu_models"
            for i in range(2) for k in ("image", "gpu_models")}


def _candidates(t: TrainingJob) -> list[Cluster]:
    """The enabled clusters a floating training job may go to, by the placement step's own rule
    (``multicluster.excluded``): its choice's names and labels, a node of an architecture its
    image is built for (as its project sees the catalog), a GPU model it allows. Reachability
    is not asked: an unreachable cluster may come back."""
    from dataclasses import replace

    from scheduling.engine import multicluster as M
    from scheduling.engine.placement import model_family
    from scheduling.services.placement import ChoiceContext, cluster_views

    ctx = ChoiceContext()
    enabled = list(ctx.enabled().values())
    views = cluster_views(enabled)
    needs = M.JobNeeds(arches=ctx.arches(t.project, {t.image_reference}).get(t.image_reference, frozenset()),
                       gpu_models=frozenset(model_family(m) for m in t.gpu_models or []),
                       gpus=float(t.workers * t.gpu_count))
    wanted = M.ClusterChoice.of(t.cluster_choice)
    return [c for c in enabled
            if M.excluded(wanted, needs, replace(views[c.pk], closed_reason="", reachable=True)) is None]


def _check_limits(t: TrainingJob) -> None:
    """The quota pre-check on its cluster; a floating job is refused only when it could never
    start on any cluster it may go to (the first refusal is shown)."""
    if t.cluster is not None:
        kind_check(TRAINING_KIND, project=t.project, cluster=t.cluster, row=t)
        return
    first: ValidationError | None = None
    for cluster in _candidates(t):
        try:
            kind_check(TRAINING_KIND, project=t.project, cluster=cluster, row=t)
        except ValidationError as exc:
            first = first or exc
        else:
            return
    if first is not None:
        raise first


def _clean_depends_on(project: Project, depends_on: list[TrainingJob] | None) -> list[TrainingJob]:
    deps = list(depends_on or [])
    for d in deps:
        if d.project_id != project.pk:
            raise ValidationError({"depends_on": ["Dependencies must be training jobs of the same project."]})
        if d.state in ("failed", "stopped"):
            raise ValidationError({"depends_on": [f"{d.name} has already {d.state}; it will never succeed."]})
    return deps


def _training_begin(actor: User, t: TrainingJob, deps: list[TrainingJob], profile: Profile | None) -> None:
    """Quota pre-check, save, then submit its first run now or wait for its dependencies; audited."""
    _check_limits(t)
    refuse_if_over_storage(project=t.project, extra_gib=t.checkpoint_volume_gib,
                           field="checkpoint_volume_gib")
    _save(t, "This project already has a training job with this name.")
    if deps:
        t.depends_on.set(deps)
    pending = [d.name for d in deps if d.state != "succeeded"]
    if pending:
        t.blocked_reason = f"Waiting for {', '.join(pending)} to succeed"
        t.save(update_fields=["blocked_reason"])
    else:
        _training_run(actor, t, t.name)
    _audit(
        "training.submitted",
        t,
        actor=actor,
        after={**snapshot(t, TRAINING_FIELDS), "depends_on": [d.pk for d in deps],
               **({"preset": profile.name} if profile is not None else {})},
    )
