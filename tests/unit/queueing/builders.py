"""Builders for queueing tests: queue trees, jobs and running jobs in one line each."""

from __future__ import annotations

from scheduling.engine import ClusterSnapshot, Job, PodGroup, PodPlacement, pod
from scheduling.engine.cycle import CycleConfig, CycleResult, run_cycle
from scheduling.engine.model import GpuGrant
from scheduling.engine.queueing import ProjectQueue, QueueTree, Quota, RunningJob, TenantQueue


def tree(spec: dict[str, dict[str, Quota]], tenants: dict[str, Quota] | None = None,
         cluster: Quota | None = None) -> QueueTree:
    """``{"vision": {"det": Quota(...), ...}, ...}`` → a tree with projects ``vision/det``."""
    tenants = tenants or {}
    return QueueTree(
        tenants=tuple(
            TenantQueue(
                t,
                tenants.get(t, Quota()),
                tuple(ProjectQueue(f"{t}/{p}", q) for p, q in projects.items()),
            )
            for t, projects in spec.items()
        ),
        quota=cluster or Quota(),
    )


def gjob(name: str, gpus: int = 1, queue: str = "t/p", *, replicas: int = 1, priority: int = 0,
         submit: float = 0.0, preemptible: bool = True, estimate: float | None = None,
         share: int = 0, cpu: int = 0, gang: bool = True, models: tuple[str, ...] = ()) -> Job:
    """A job of ``replicas`` pods with ``gpus`` whole GPUs each (or ``share`` % of one GPU)."""
    if share:
        template = pod("x", gpu_count=1, gpu_memory_percent=share, gpu_cores_percent=share,
                       cpu_millicores=cpu, gpu_models=models)
    else:
        template = pod("x", gpu_count=gpus, cpu_millicores=cpu, gpu_models=models)
    return Job(name=name, groups=(PodGroup("w", template, replicas),), queue=queue,
               priority=priority, submit_time=submit, preemptible=preemptible,
               runtime_estimate_s=estimate, gang=gang)


def running(name: str, node: str, gpu_indices: tuple[int, ...], queue: str = "t/p", *,
            priority: int = 0, start: float = 0.0, preemptible: bool = True,
            checkpointable: bool = False, estimate: float | None = None,
            memory_mib: int = 40_960, share: int = 0) -> RunningJob:
    """A running one-pod job holding whole cards ``gpu_indices`` of ``node`` (or ``share`` % of
    each)."""
    grants = tuple(
        GpuGrant(index=i, uuid=f"{node}-GPU-{i}", gpu_model="A100",
                 gpu_memory_mib=memory_mib * share // 100 if share else memory_mib,
                 gpu_cores_percent=share or 100, exclusive=not share)
        for i in gpu_indices
    )
    return RunningJob(
        name=name,
        pods=(PodPlacement(pod=f"{name}-0", node=node, gpus=grants),),
        queue=queue,
        priority=priority,
        preemptible=preemptible,
        checkpointable=checkpointable,
        start_time=start,
        runtime_estimate_s=estimate,
    )


def with_running(snapshot: ClusterSnapshot, jobs: list[RunningJob]) -> ClusterSnapshot:
    """The snapshot with the running jobs' pods as allocations."""
    from scheduling.engine import Allocation

    allocs = tuple(
        Allocation(job=j.name, placement=pp, queue=j.queue, priority=j.priority,
                   preemptible=j.preemptible, start_time=j.start_time)
        for j in jobs
        for pp in j.pods
    )
    return ClusterSnapshot(nodes=snapshot.nodes, allocations=allocs)


def cycle(snapshot: ClusterSnapshot, pending: list[Job], qtree: QueueTree, *,
          run: list[RunningJob] | None = None, now: float = 1_000.0,
          config: CycleConfig | None = None) -> CycleResult:
    """Run one cycle with ``run`` jobs already on the cluster."""
    run = run or []
    return run_cycle(with_running(snapshot, run), pending, qtree, now=now, running=run,
                     config=config)
