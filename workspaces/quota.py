"""Quota checks at submit: refuse at once what could never run, naming the resource.

The scheduler would reject such a job in its next cycle anyway (``engine.cycle``'s
``check_never``); checking here, with the same engine functions, turns it into a 400 on
the form or API call instead of a job that is created only to be rejected.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Q, Sum

from scheduling import engine as E
from scheduling.engine.queueing import RESOURCE_NAMES, TreeState, format_amount, job_ask
from scheduling.models import Cluster, GpuDevice
from scheduling.selectors import queue_name, queue_tree
from scheduling.services.common import STORAGE_LOCK_CLASS, xact_locks
from tenants.models import Project

# The request field that carries each engine resource (GPU, GPU memory, CPU, RAM).
_FIELDS = ("gpu_count", "gpu_memory_mib", "cpu_millicores", "ram_mib")


def refuse_if_never_within_limits(*, project: Project, cluster: Cluster,
                                  groups: list[dict[str, Any]], preemptible: bool = True) -> None:
    """ValidationError (keyed by the request field) when the groups ask more than a limit on
    the project's path (project, tenant or cluster quota), or more than a quota across all
    clusters allows (``refuse_if_never_within_all_clusters``) — it could never start."""
    egroups = tuple(
        E.PodGroup(
            name=g["name"],
            template=E.pod(f"new-{g['name']}", gpu_count=g.get("gpu_count", 0),
                           gpu_memory_mib=g.get("gpu_memory_mib", 0),
                           gpu_cores_percent=g.get("gpu_cores_percent", 0),
                           exclusive=g.get("exclusive", False),
                           cpu_millicores=g.get("cpu_millicores", 0), ram_mib=g.get("ram_mib", 0),
                           gpu_models=frozenset(g.get("gpu_models") or ())),
            replicas=g.get("replicas", 1),
        )
        for g in groups
    )
    queue = queue_name(project.tenant.name, project.name)
    devices = list(GpuDevice.objects.filter(node__cluster=cluster, node__present=True).values_list(
        "model", "memory_mib"))
    job = E.Job(name="new", groups=egroups, queue=queue, preemptible=preemptible)
    ask = job_ask(job, min((m for _, m in devices), default=0))
    refuse_if_never_within_all_clusters(project=project, job=job, devices=devices)
    tree = TreeState(queue_tree(cluster))
    over = tree.never_within_limit(queue, ask)
    if over is None:
        return
    n, r = over
    limit = tree.limit[n][r]
    assert limit is not None
    raise ValidationError({_FIELDS[r]: [
        f"This asks {format_amount(r, ask[r])} {RESOURCE_NAMES[r]} in all, more than "
        f"{tree.label(n)}'s {RESOURCE_NAMES[r]} limit of {format_amount(r, limit)}: it could never start."
    ]})


def refuse_if_never_within_all_clusters(*, project: Project, job: E.Job,
                                        devices: list[tuple[str, int]]) -> None:
    """ValidationError (keyed by the request field) when ``job`` could never start under a
    quota across all clusters of its project or tenant, by the rules the cycle rejects it by
    (``scheduling.services.all_clusters``): its GPUs above a GPU limit across all clusters; for
    every GPU model class of ``devices`` (the cluster's cards: (model, MiB)) it may use, its GPU
    memory above the class's limit across all clusters; a non-preemptible job, more GPUs than a
    level's per-cluster guarantee + its guarantee across all clusters (a level guaranteeing
    nothing across all clusters restricts nothing here, as in the cycle). One query when the
    tenant has no such quota."""
    from scheduling.engine.guarantees import beyond_words, nonpreemptible_refusal
    from scheduling.engine.multicluster import job_gpus, job_memory, never_all_clusters, usable_classes
    from scheduling.engine.placement import model_family
    from scheduling.selectors import all_cluster_limits
    from scheduling.services.all_clusters import owners
    from tenants.models import Quota, QuotaScope

    limits = all_cluster_limits([project.tenant_id])
    if not limits:
        return
    ids = (project.pk, project.tenant_id)
    ask = job_gpus(job)
    cards: dict[str, tuple[int, frozenset[str]]] = {}
    floors: dict[str, int] = {}
    for model, mib in devices:
        cls = model_family(model)
        big, names = cards.get(cls, (0, frozenset()))
        cards[cls] = (max(big, mib), names | {model})
        floors[cls] = min(floors.get(cls, mib), mib)
    memory = {cls: job_memory(job, floors[cls]) for cls in usable_classes(job, cards)}
    never = never_all_clusters(ask, memory, owners(limits, ids, job.queue), job.mixed_gpu_models)
    if never is not None:
        raise ValidationError({never[0]: [f"This asks {never[1]}: it could never start."]})
    guaranteed = [(level, key, total) for level, key, total in (
        ("project", project.pk, limits.project_guarantee.get(project.pk)),
        ("tenant", project.tenant_id, limits.tenant_guarantee.get(project.tenant_id))) if total]
    if job.preemptible or not guaranteed or ask <= 0:
        return
    bases = dict(Quota.objects.filter(
        Q(scope=QuotaScope.PROJECT, project_id=project.pk)
        | Q(scope=QuotaScope.TENANT, tenant_id=project.tenant_id)).values_list("scope", "gpus_guaranteed"))
    for level, _, total in guaranteed:
        base = float(bases.get(QuotaScope.PROJECT if level == "project" else QuotaScope.TENANT) or 0)
        if total is not None and nonpreemptible_refusal(0.0, ask, base + total) == "never":
            who = f"project {job.queue}" if level == "project" else f"tenant {project.tenant.name}"
            raise ValidationError({"gpu_count": [
                f"This non-preemptible job asks {ask:g} GPUs, more than {who}'s GPU guarantee can ever "
                f"cover ({base:g} per cluster + {total:g} on all clusters together): it could never "
                f"start; {beyond_words()}."]})


def refuse_if_over_storage(*, project: Project, extra_gib: int, field: str,
                           exclude_env: int | None = None) -> None:
    """Home and checkpoint volumes count against the project's storage limit. Counted under
    the project's storage lock (``xact_locks``, as the GPU quotas across clusters are), held
    to the caller's commit: concurrent launches are counted one after the other, each
    seeing the volumes the earlier ones saved, so together they never exceed the limit."""
    from .models import DevEnvironment, TrainingJob
    from .selectors import policy_for

    limit = policy_for(project).storage_gib_limit
    if limit is None or extra_gib <= 0:
        return
    xact_locks(STORAGE_LOCK_CLASS, [project.pk])
    envs = DevEnvironment.objects.filter(project=project)
    if exclude_env is not None:
        envs = envs.exclude(pk=exclude_env)
    used = (envs.aggregate(s=Sum("home_gib"))["s"] or 0) + (
        TrainingJob.objects.filter(project=project).aggregate(s=Sum("checkpoint_volume_gib"))["s"] or 0)
    if used + extra_gib > limit:
        raise ValidationError({field: [
            f"Storage: {extra_gib} GiB more would exceed project {project}'s volume limit of "
            f"{limit} GiB ({used} GiB already in use)."]})


def refuse_if_no_node_holds_all(*, cluster: Cluster, groups: list[dict[str, Any]], field: str) -> None:
    """ValidationError on ``field`` when no node of ``cluster``, even empty, could hold every
    pod of ``groups`` at once — the engine's same-node rule (``Placer._affinity_never_fits``)
    with the same placer, so a same-node job refused here is one the scheduler would reject.
    A cluster with no nodes yet refuses nothing (its nodes may not be synced)."""
    from scheduling.engine.state import empty_node
    from scheduling.selectors import _cluster_part

    pods = [E.pod(f"new-{g['name']}-{i}", gpu_count=g.get("gpu_count", 0),
                  gpu_memory_mib=g.get("gpu_memory_mib", 0), gpu_cores_percent=g.get("gpu_cores_percent", 0),
                  exclusive=g.get("exclusive", False), cpu_millicores=g.get("cpu_millicores", 0),
                  ram_mib=g.get("ram_mib", 0))
            for g in groups for i in range(g.get("replicas", 1))]
    nodes = _cluster_part(cluster)[0]
    if not nodes or len(pods) < 2:
        return
    for node in nodes:
        placer = E.Placer(E.ClusterState(E.ClusterSnapshot(nodes=(empty_node(node),))))
        if all(placer.place_pod(p) is not None for p in pods):
            return
    need = (f"{sum(g.get('gpu_count', 0) * g.get('replicas', 1) for g in groups)} GPU slice(s) of "
            f"{' + '.join(str(g.get('gpu_memory_mib', 0)) + ' MiB' for g in groups)}, "
            f"{sum(g.get('cpu_millicores', 0) for g in groups)} mCPU, "
            f"{sum(g.get('ram_mib', 0) for g in groups)} MiB RAM")
    raise ValidationError({field: [
        f"These {len(pods)} pods must share one node ({need}), and no node of cluster {cluster} "
        f"could hold them all even when empty."]})
