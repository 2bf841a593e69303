"""Quota checks at submit: refuse at once what could never run, naming the resource.

The scheduler would reject such a job in its next cycle anyway (``engine.cycle``'s
``check_never``); checking here, with the same engine functions, turns it into a 400 on
the form or API call instead of a job that is created only to be rejected.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import Sum

from scheduling import engine as E
from scheduling.engine.queueing import RESOURCE_NAMES, TreeState, format_amount, job_ask
from scheduling.models import Cluster, GpuDevice
from scheduling.selectors import queue_name, queue_tree
from tenants.models import Project

# The request field that carries each engine resource (GPU, GPU memory, CPU, RAM).
_FIELDS = ("gpu_count", "gpu_memory_mib", "cpu_millicores", "ram_mib")


def refuse_if_never_within_limits(*, project: Project, cluster: Cluster,
                                  groups: list[dict[str, Any]]) -> None:
    """ValidationError (keyed by the request field) when the groups ask more than a limit on
    the project's path (project, tenant or cluster quota) — it could never start."""
    egroups = tuple(
        E.PodGroup(
            name=g["name"],
            template=E.pod(f"new-{g['name']}", gpu_count=g.get("gpu_count", 0),
                           gpu_memory_mib=g.get("gpu_memory_mib", 0),
                           gpu_cores_percent=g.get("gpu_cores_percent", 0),
                           exclusive=g.get("exclusive", False),
                           cpu_millicores=g.get("cpu_millicores", 0), ram_mib=g.get("ram_mib", 0)),
            replicas=g.get("replicas", 1),
        )
        for g in groups
    )
    queue = queue_name(project.tenant.name, project.name)
    mems = GpuDevice.objects.filter(node__cluster=cluster, node__present=True).values_list(
        "memory_mib", flat=True)
    ask = job_ask(E.Job(name="new", groups=egroups, queue=queue), min(mems, default=0))
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


def refuse_if_over_storage(*, project: Project, extra_gib: int, field: str,
                           exclude_env: int | None = None) -> None:
    """Home and checkpoint volumes count against the project's storage limit."""
    from .models import DevEnvironment, TrainingJob
    from .selectors import policy_for

    limit = policy_for(project).storage_gib_limit
    if limit is None or extra_gib <= 0:
        return
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
        f"These {len(pods)} pods must share one node ({need}), and no node of cluster {cluster.name} "
        f"could hold them all even when empty."]})
