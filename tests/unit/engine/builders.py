"""Builders for engine tests: small clusters and requests in one line each."""

from __future__ import annotations

from scheduling.engine import (
    ClusterSnapshot,
    GpuDevice,
    Job,
    JobAffinity,
    Node,
    Overcommit,
    PodGroup,
    PodRequest,
    SharingMode,
    SliceTemplate,
    Topology,
)


def gpus(
    n: int,
    *,
    model: str = "A100",
    memory_mib: int = 40_960,
    prefix: str = "GPU",
    sharing: SharingMode = SharingMode.SHAREABLE,
    templates: tuple[SliceTemplate, ...] = (),
    max_sharers: int = 10,
    numa: tuple[int, ...] | None = None,
    utilization: tuple[float, ...] | None = None,
    unhealthy: tuple[int, ...] = (),
) -> tuple[GpuDevice, ...]:
    return tuple(
        GpuDevice(
            index=i,
            uuid=f"{prefix}-{i}",
            model=model,
            memory_mib=memory_mib,
            numa_node=numa[i] if numa else 0,
            sharing=sharing,
            templates=templates,
            max_sharers=max_sharers,
            utilization_percent=utilization[i] if utilization else None,
            healthy=i not in unhealthy,
        )
        for i in range(n)
    )


def node(
    name: str,
    n_gpus: int = 4,
    *,
    cpu: int = 64_000,
    ram: int = 256_000,
    max_pods: int = 110,
    schedulable: bool = True,
    healthy: bool = True,
    topology: Topology | None = None,
    overcommit: Overcommit | None = None,
    **gpu_kwargs: object,
) -> Node:
    return Node(
        name=name,
        cpu_millicores=cpu,
        ram_mib=ram,
        gpus=gpus(n_gpus, prefix=f"{name}-GPU", **gpu_kwargs),  # type: ignore[arg-type]
        max_pods=max_pods,
        schedulable=schedulable,
        healthy=healthy,
        topology=topology or Topology(),
        overcommit=overcommit,
    )


def cluster(*nodes: Node) -> ClusterSnapshot:
    return ClusterSnapshot(nodes=tuple(nodes))


def job(
    name: str,
    template: PodRequest,
    replicas: int = 1,
    *,
    gang: bool = True,
    affinity: JobAffinity = JobAffinity.NONE,
) -> Job:
    return Job(name=name, groups=(PodGroup("p", template, replicas),), gang=gang, affinity=affinity)
