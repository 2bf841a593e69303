"""The invariants every fault test checks after recovery, read straight from PostgreSQL (the
truth) and from the cluster's pod store: the simulated backend's ``scheduling_simulatedpod``
rows, or the pods of a real kube-apiserver.

``Rows`` is any ``(sql, *args) -> rows`` function (a psycopg connection to the throwaway
database); each check returns what violates it (empty: holds), so a test can poll it with
``wait_until`` while the system converges and assert on it at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

Rows = Callable[..., list[tuple[Any, ...]]]

FINAL = ("succeeded", "failed", "cancelled", "rejected")
ACTIVE = ("starting", "running", "preempting")


def over_capacity(rows: Rows) -> list[tuple[Any, ...]]:
    """GPUs whose slices exceed their memory or 100% of cores, or disagree with its totals."""
    return rows("""
        SELECT g.id, g.memory_mib, coalesce(sum(s.memory_mib), 0), coalesce(sum(s.cores_percent), 0),
               g.memory_allocated_mib, g.cores_allocated
        FROM scheduling_gpudevice g LEFT JOIN scheduling_gpuslice s ON s.gpu_id = g.id
        GROUP BY g.id
        HAVING coalesce(sum(s.memory_mib), 0) > g.memory_mib
            OR coalesce(sum(s.cores_percent), 0) > 100
            OR coalesce(sum(s.memory_mib), 0) <> g.memory_allocated_mib
            OR coalesce(sum(s.cores_percent), 0) <> g.cores_allocated""")


def unsettled(rows: Rows, *, still_running: Iterable[int] = ()) -> list[str]:
    """Jobs neither final nor waiting with a reason, and allocations held by finished jobs
    (``still_running``: job ids the test keeps running on purpose)."""
    keep = sorted(still_running) or [0]
    busy = rows("""
        SELECT id, state FROM scheduling_job
        WHERE state NOT IN ('succeeded', 'failed', 'cancelled', 'rejected')
          AND NOT (state = 'queued' AND reason <> '') AND NOT (id = ANY(%s))""", keep)
    held = rows("SELECT DISTINCT j.id, j.state FROM scheduling_allocation a JOIN scheduling_job j"
                " ON j.id = a.job_id WHERE j.state = ANY(%s)", list(FINAL))
    return ([f"job {i} is {s}" for i, s in busy]
            + [f"finished job {i} ({s}) still holds an allocation" for i, s in held])


def ran_twice(rows: Rows) -> list[tuple[Any, ...]]:
    """Jobs with more than one ``started`` decision (started, then started again)."""
    return rows("SELECT job_id, count(*) FROM scheduling_schedulingdecision WHERE kind = 'started'"
                " GROUP BY job_id HAVING count(*) > 1")


@dataclass(frozen=True)
class Pod:
    """A Camp pod as the cluster has it: where it is bound ("" if nowhere) and whether it is
    being deleted."""

    name: str
    node: str
    deleting: bool = False


def allocation_rows(rows: Rows, cluster: str) -> list[tuple[str, str, str, int]]:
    """(pod name, node, job state, job id) of every allocation row of ``cluster``."""
    return [(str(p), str(n), str(s), int(j)) for p, n, s, j in rows("""
        SELECT a.pod_name, n.name, j.state, j.id FROM scheduling_allocation a
        JOIN scheduling_node n ON n.id = a.node_id JOIN scheduling_job j ON j.id = a.job_id
        JOIN scheduling_cluster c ON c.id = a.cluster_id WHERE c.name = %s""", cluster)]


def simulated_pods(rows: Rows, cluster: str) -> list[Pod]:
    """The simulated backend's pod store: its live (not deleted) pods of ``cluster``."""
    return [Pod(str(name), str(node)) for name, node in rows("""
        SELECT p.name, p.node FROM scheduling_simulatedpod p
        JOIN scheduling_cluster c ON c.id = p.cluster_id
        WHERE c.name = %s AND p.deleted_at IS NULL""", cluster)]


def kube_pods(core: Any) -> list[Pod]:
    """Camp's pods in a real apiserver (label ``app.kubernetes.io/managed-by=camp``)."""
    listed = core.list_pod_for_all_namespaces(label_selector="app.kubernetes.io/managed-by=camp")
    return [Pod(p.metadata.name, p.spec.node_name or "", p.metadata.deletion_timestamp is not None)
            for p in listed.items]


def allocations_vs_pods(allocs: Iterable[tuple[str, str, str, int]], pods: Iterable[Pod]) -> list[str]:
    """Allocation rows equal pods: every allocation of a running job has its pod, bound to
    the same node and not being deleted (no phantom allocation); every Camp pod has an
    allocation of an admitted job on its node (no orphan pod). Pods of a starting job may
    still be on their way, and a preempting job's are being deleted: only their presence
    where the database says counts."""
    by_pod = {p.name: p for p in pods}
    rows = {name: (node, state, job) for name, node, state, job in allocs}
    problems = []
    for name, (node, state, job) in sorted(rows.items()):
        pod = by_pod.get(name)
        if state != "running":
            continue
        if pod is None:
            problems.append(f"phantom allocation: running job {job} holds {name} on {node}, no such pod")
        elif pod.node != node or pod.deleting:
            problems.append(f"job {job}'s pod {name} is on {pod.node or 'no node'}"
                            f"{' (being deleted)' if pod.deleting else ''}, its allocation on {node}")
    for pod in sorted(by_pod.values(), key=lambda p: p.name):
        row = rows.get(pod.name)
        if row is None:
            problems.append(f"orphan pod {pod.name} on {pod.node or 'no node'}: no allocation")
        elif row[1] not in ACTIVE:
            problems.append(f"pod {pod.name} of {row[1]} job {row[2]} still exists")
        elif pod.node and pod.node != row[0]:
            problems.append(f"pod {pod.name} is bound to {pod.node}, its allocation on {row[0]}")
    return problems
