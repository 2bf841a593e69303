"""One submission path for workload kinds (issue 14).

Every workload kind — dev environments (``services/environments.py``), training jobs
(``services/training.py``) and model services (``services/serving.py``) — is described once by a
:class:`WorkloadKind`: the pod groups of one run, the scheduling options of its jobs, its
shape fields, how a scheduling Job leads back to the workload row, what its pods look like
(container ports, probes, volumes, extra Kubernetes objects) and how a job state reads to
users. The shared path does the rest, the same way for every kind:

* :func:`kind_check` — the quota pre-check (a run that could never fit within a limit is a
  400 naming the field, not a job created only to be rejected), and for kinds that ask for
  it the shape rules and "no card of the cluster is large enough";
* :func:`kind_run` — job creation through ``scheduling.services.job_submit`` (which writes
  the ``job.submitted`` audit event and requests a cycle after commit);
* :func:`kind_audit` — the kind's own audit events (``<kind>.<action>``);
* :func:`kinds_job_spec_hook` — the one job spec hook (scheduling/extensions.py) that hands
  a kind's jobs to its ``specs``;
* :func:`kind_status` — job state → the workload's state word.

Adding a kind is one module that builds a ``WorkloadKind`` and calls :func:`register_kind`,
plus its serializer and CLI verbs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Model

from scheduling.backends.base import JobObjects, NamespaceSpec, PodSpec
from scheduling.models import Cluster, Job
from tenants.audit import audit_record
from tenants.models import Project, User

from .models import _state_of
from .quota import refuse_if_never_within_limits

SHAPE_FIELDS = ("gpu_count", "gpu_memory_mib", "gpu_cores_percent", "exclusive", "cpu_millicores", "ram_mib")

Specs = Callable[[Any, Job, NamespaceSpec, JobObjects, list[PodSpec]], tuple[JobObjects, list[PodSpec]]]


@dataclass(frozen=True)
class WorkloadKind:
    name: str
    """The audit prefix (``service``, ``environment``, ``training``)."""
    job_kinds: tuple[str, ...]
    """Every ``Job.kind`` its runs may have; the spec hook recognises its jobs by them."""
    job_kind_of: Callable[[Any], str]
    """``Job.kind`` of a row's run (an environment's kind, a training job's framework)."""
    groups: Callable[[Any], list[dict[str, Any]]]
    """The pod groups of one run of a row (``job_submit``'s ``groups``)."""
    job_options: Callable[[Any], dict[str, Any]]
    """``job_submit``'s other options for a row: priority_class, preemptible, gang, ..."""
    row_of_job: Callable[[Job], Any | None]
    """The workload row a job is a run of (None: not this kind's)."""
    specs: Specs
    """``(row, job, namespace, objects, pods) -> (objects, pods)``: ports, probes, volumes,
    extra Kubernetes objects. Deterministic (a retried dispatch calls it again)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Field defaults a create fills in when the caller gives none."""
    status: Mapping[str, str] = field(default_factory=dict)
    """Job state → the kind's own word where it differs from the common mapping."""
    check_shape: bool = False
    """Whether ``kind_check`` validates the shape and refuses a slice no card can hold (kinds
    that validate their shape themselves, with their own messages, leave it off)."""


KINDS: dict[str, WorkloadKind] = {}
"""``Job.kind`` → its workload kind."""


def register_kind(kind: WorkloadKind) -> WorkloadKind:
    """Register ``kind`` for each of its job kinds (registering again replaces it)."""
    for job_kind in kind.job_kinds:
        KINDS[job_kind] = kind
    return kind


def clean_shape(data: Mapping[str, Any]) -> None:
    """The per-pod shape rules every kind shares (the same as environments' and training's)."""
    from .services.common import _clean_shape

    _clean_shape(dict(data))


def kind_check(kind: WorkloadKind, *, project: Project, cluster: Cluster, row: Any) -> None:
    """Refuse a run that could never fit within a limit, per cluster or across all clusters
    (and, with ``check_shape``, a bad shape or a slice larger than every card)."""
    if kind.check_shape:
        clean_shape({f: getattr(row, f) for f in SHAPE_FIELDS})
        _refuse_if_no_card_fits(cluster, row)
    refuse_if_never_within_limits(project=project, cluster=cluster, groups=kind.groups(row),
                                  preemptible=_preemptible(kind, kind.job_options(row)))


def _preemptible(kind: WorkloadKind, options: Mapping[str, Any]) -> bool:
    """Whether a run with these ``job_submit`` options is preemptible (unsaid: the one default,
    ``scheduling.models.preemptible_default``, for this kind)."""
    from scheduling.models import PriorityClass, preemptible_default

    given = options.get("preemptible")
    if given is None:
        return preemptible_default(options.get("priority_class", PriorityClass.NORMAL), workload=kind.name)
    return bool(given)


def _refuse_if_no_card_fits(cluster: Cluster, row: Any) -> None:
    """A slice larger than every card of the cluster could never be placed."""
    from django.core.exceptions import ValidationError
    from django.db.models import Max

    from scheduling.models import GpuDevice

    mem = getattr(row, "gpu_memory_mib", 0)
    if not mem:
        return
    largest = GpuDevice.objects.filter(node__cluster=cluster, node__present=True).aggregate(
        m=Max("memory_mib"))["m"]
    if largest is not None and mem > largest:
        raise ValidationError({"gpu_memory_mib": [
            f"{mem} MiB per GPU: the largest GPU of cluster {cluster} has {largest} MiB."]})


def kind_run(kind: WorkloadKind, *, actor: User, row: Any, name: str,
             choice: dict[str, Any] | None = None) -> Job:
    """Queue one run of ``row``: a scheduling Job (audited ``job.submitted``, a cycle — or for
    a floating row a placement step — requested after commit); name clashes are reported on
    the workload's ``name``. ``choice`` replaces a floating row's own choice for this run."""
    from .services.common import _submit_run

    # A row with no cluster floats (training jobs launched for any cluster, a set or labels):
    # its run is submitted with the row's choice and placed by the global queue.
    where: dict[str, Any] = {"cluster": row.cluster}
    if row.cluster is None:
        own = getattr(row, "cluster_choice", None)
        where["cluster_choice"] = dict((choice if choice is not None else own) or {})
    return _submit_run(actor=actor, project=row.project, name=name, kind=kind.job_kind_of(row),
                       groups=kind.groups(row), **where, **kind.job_options(row))


def kind_audit(kind: WorkloadKind, action: str, row: Model, *, actor: User | None,
               actor_username: str | None = None, **extra: Any) -> None:
    """``<kind>.<action>`` in the caller's transaction; without ``actor`` the platform
    component ``actor_username`` (the autoscaler) is recorded."""
    audit_record(actor=actor, actor_username=actor_username if actor is None else None,
                 action=f"{kind.name}.{action}", target=row, tenant=row.tenant,  # type: ignore[attr-defined]
                 project=row.project, **extra)  # type: ignore[attr-defined]


def kind_status(kind: WorkloadKind, job_state: str | None) -> str:
    return kind.status.get(job_state or "", _state_of(job_state))


def kinds_job_spec_hook(job: Job, ns: Any, objs: JobObjects,
                        pods: list[PodSpec]) -> tuple[JobObjects, list[PodSpec]] | None:
    kind = KINDS.get(job.kind)
    if kind is None:
        return None
    row = kind.row_of_job(job)
    if row is None:
        return None
    return kind.specs(row, job, ns, objs, pods)
