"""Queueing: the queue tree (cluster → tenant → project), usage, fair share, ordering and aging.

Resources are counted in four dimensions that mirror ``tenants.models.Quota``: GPUs (fractions
allowed), GPU memory (MiB), CPU and RAM (MiB). Internally every amount is an integer (thousandths
of a GPU, MiB, millicores, MiB) so that sums never drift.

Rules implemented here (each function's docstring states its rule):

* usage of a queue = the resources of the running allocations charged to it and to its subtree;
* a job fits its quota iff, at every level of its path, usage + ask stays within the limit
  (an empty limit means "no limit beyond the parent's");
* a job is *borrowing* when it runs beyond its project's guaranteed share;
* a non-preemptible job runs only within the guaranteed share of every queue on its path (usage of
  non-preemptible jobs + ask within each guaranteed amount; a resource a queue guarantees nothing of
  does not restrict it), because capacity it held beyond the guarantee could never be reclaimed;
* ordering: aged jobs first (oldest first), then priority (high first), then fair share at each
  level of the tree (lowest dominant share of usage over guaranteed first), then submit time.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from scheduling.engine import accounting
from scheduling.engine.guarantees import nonpreemptible_refusal
from scheduling.engine.model import (
    Allocation,
    ClusterSnapshot,
    GpuGrant,
    Job,
    PodPlacement,
    PodRequest,
)

Number = int | float | Decimal

# --------------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------------

RESOURCE_NAMES = ("GPU", "GPU memory", "CPU", "RAM")
"""Names of the four quota dimensions, as users read them."""


def _milli(x: Number) -> int:
    return int((Decimal(str(x)) * 1000).to_integral_value())


@dataclass(frozen=True, slots=True)
class Resources:
    """An amount of the four quota resources, in integer units.

    ``gpu_milli`` is thousandths of a GPU (a half card is 500); ``cpu_millicores`` thousandths of
    a core. Use :meth:`of` to build one from GPUs and cores as the quota rows store them."""

    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    cpu_millicores: int = 0
    ram_mib: int = 0

    @classmethod
    def of(
        cls,
        *,
        gpus: Number = 0,
        gpu_memory_mib: Number = 0,
        cpu_cores: Number = 0,
        ram_mib: Number = 0,
    ) -> Resources:
        """Build from quota units: GPUs and CPU cores (fractions allowed), MiB."""
        return cls(_milli(gpus), int(gpu_memory_mib), _milli(cpu_cores), int(ram_mib))

    def vec(self) -> tuple[int, int, int, int]:
        """The amounts as a tuple in :data:`RESOURCE_NAMES` order."""
        return (self.gpu_milli, self.gpu_memory_mib, self.cpu_millicores, self.ram_mib)

    @classmethod
    def from_vec(cls, v: Sequence[int]) -> Resources:
        """Inverse of :meth:`vec`."""
        return cls(v[0], v[1], v[2], v[3])

    def __add__(self, o: Resources) -> Resources:
        return Resources.from_vec([a + b for a, b in zip(self.vec(), o.vec(), strict=True)])

    def __sub__(self, o: Resources) -> Resources:
        return Resources.from_vec([a - b for a, b in zip(self.vec(), o.vec(), strict=True)])

    @property
    def gpus(self) -> float:
        """GPUs, as a float."""
        return self.gpu_milli / 1000


def format_amount(r: int, v: int) -> str:
    """A user-facing amount of resource ``r`` (index into :data:`RESOURCE_NAMES`)."""
    if r == 0:
        return _num(v / 1000)
    if r == 2:
        return f"{_num(v / 1000)} cores"
    if v >= 1024 and v % 1024 == 0:
        return f"{v // 1024} GiB"
    return f"{v} MiB"


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:.3g}"


# --------------------------------------------------------------------------------------------------
# Quotas and the queue tree
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quota:
    """Guaranteed and limit per resource for one queue; the fields mirror ``tenants.models.Quota``.

    A limit of None means "no limit beyond the parent's"."""

    gpus_guaranteed: Number = 0
    gpus_limit: Number | None = None
    gpu_memory_mib_guaranteed: int = 0
    gpu_memory_mib_limit: int | None = None
    cpu_cores_guaranteed: Number = 0
    cpu_cores_limit: Number | None = None
    ram_mib_guaranteed: int = 0
    ram_mib_limit: int | None = None

    def guaranteed(self) -> Resources:
        """The guaranteed amounts."""
        return Resources.of(
            gpus=self.gpus_guaranteed,
            gpu_memory_mib=self.gpu_memory_mib_guaranteed,
            cpu_cores=self.cpu_cores_guaranteed,
            ram_mib=self.ram_mib_guaranteed,
        )

    def limits(self) -> tuple[int | None, int | None, int | None, int | None]:
        """The limits in integer units, None where empty."""
        return (
            None if self.gpus_limit is None else _milli(self.gpus_limit),
            None if self.gpu_memory_mib_limit is None else int(self.gpu_memory_mib_limit),
            None if self.cpu_cores_limit is None else _milli(self.cpu_cores_limit),
            None if self.ram_mib_limit is None else int(self.ram_mib_limit),
        )


@dataclass(frozen=True, slots=True)
class ProjectQueue:
    """A project's queue. ``name`` is what ``Job.queue`` and ``Allocation.queue`` carry
    (conventionally ``"<tenant>/<project>"``)."""

    name: str
    quota: Quota = field(default_factory=Quota)


@dataclass(frozen=True, slots=True)
class TenantQueue:
    """A tenant and its projects."""

    name: str
    quota: Quota = field(default_factory=Quota)
    projects: tuple[ProjectQueue, ...] = ()


@dataclass(frozen=True, slots=True)
class QueueTree:
    """The queue tree of one cluster: cluster → tenant → project."""

    tenants: tuple[TenantQueue, ...] = ()
    quota: Quota = field(default_factory=Quota)
    """The cluster's own quota (its limits cap the whole tree)."""
    name: str = "cluster"


LEVELS = ("Cluster", "Tenant", "Project")


class TreeState:
    """Usage and quotas of every queue during one cycle, indexed by integers.

    Node 0 is the cluster; tenants and projects follow. ``path[p]`` lists a project's nodes from
    the project up to the cluster."""

    def __init__(self, tree: QueueTree) -> None:
        self.tree = tree
        self.names: list[str] = [tree.name]
        self.level: list[int] = [0]
        self.parent: list[int] = [-1]
        self.guaranteed: list[tuple[int, ...]] = [tree.quota.guaranteed().vec()]
        self.limit: list[tuple[int | None, ...]] = [tree.quota.limits()]
        self.project_index: dict[str, int] = {}
        self.tenant_of: dict[int, int] = {}
        for t in tree.tenants:
            ti = self._add(t.name, 1, 0, t.quota)
            for p in t.projects:
                if p.name in self.project_index:
                    raise ValueError(f"duplicate project queue {p.name!r}")
                pi = self._add(p.name, 2, ti, p.quota)
                self.project_index[p.name] = pi
                self.tenant_of[pi] = ti
        self.usage: list[list[int]] = [[0, 0, 0, 0] for _ in self.names]
        self.np_usage: list[list[int]] = [[0, 0, 0, 0] for _ in self.names]
        """The part of ``usage`` held by non-preemptible jobs."""
        self.path: dict[int, tuple[int, ...]] = {
            pi: (pi, self.tenant_of[pi], 0) for pi in self.project_index.values()
        }

    def _add(self, name: str, level: int, parent: int, quota: Quota) -> int:
        self.names.append(name)
        self.level.append(level)
        self.parent.append(parent)
        self.guaranteed.append(quota.guaranteed().vec())
        self.limit.append(quota.limits())
        return len(self.names) - 1

    def path_of(self, queue: str) -> tuple[int, ...]:
        """The nodes charged for a job of ``queue``: project, tenant, cluster (cluster only for an
        unknown queue)."""
        pi = self.project_index.get(queue)
        return self.path[pi] if pi is not None else (0,)

    def label(self, node: int) -> str:
        """How a user names a queue: ``Project vision/detection``."""
        return f"{LEVELS[self.level[node]]} {self.names[node]}"

    # -- usage ---------------------------------------------------------------------------------

    def charge(
        self, queue: str, amount: Sequence[int], sign: int = 1, *, nonpreemptible: bool = False
    ) -> None:
        """Rule (usage): a running job's resources count at every level of its path (and, for a
        non-preemptible job, in that level's non-preemptible usage too)."""
        for n in self.path_of(queue):
            u = self.usage[n]
            for r in range(4):
                u[r] += sign * amount[r]
            if nonpreemptible:
                npu = self.np_usage[n]
                for r in range(4):
                    npu[r] += sign * amount[r]

    def quota_violation(self, queue: str, ask: Sequence[int]) -> tuple[int, int] | None:
        """Rule (limits): a job fits its quota iff at every level of its path usage + ask stays
        within that level's limit; an empty limit means no limit beyond the parent's.
        Returns the first (node, resource) that would be exceeded, else None."""
        for n in self.path_of(queue):
            lim = self.limit[n]
            u = self.usage[n]
            for r in range(4):
                cap = lim[r]
                if cap is not None and ask[r] > 0 and u[r] + ask[r] > cap:
                    return (n, r)
        return None

    def never_within_limit(self, queue: str, ask: Sequence[int]) -> tuple[int, int] | None:
        """Rule (quota reject): a job that asks more than a limit on its path can never run."""
        for n in self.path_of(queue):
            lim = self.limit[n]
            for r in range(4):
                cap = lim[r]
                if cap is not None and ask[r] > cap:
                    return (n, r)
        return None

    def guarantee_violation(self, queue: str, ask: Sequence[int]) -> tuple[int, int] | None:
        """Rule (non-preemptible within guarantee): a non-preemptible job may start only if, at
        every level of its path (project, tenant, cluster), the usage of non-preemptible jobs + ask
        stays within the guaranteed amount of every resource that level guarantees. A resource a
        level guarantees nothing of (0) does not restrict at that level. Returns the first
        (node, resource) that would go beyond its guarantee, else None."""
        for n in self.path_of(queue):
            g = self.guaranteed[n]
            u = self.np_usage[n]
            for r in range(4):
                if g[r] > 0 and ask[r] > 0 and nonpreemptible_refusal(u[r], ask[r], g[r]):
                    return (n, r)
        return None

    def never_within_guarantee(self, queue: str, ask: Sequence[int]) -> tuple[int, int] | None:
        """Rule (non-preemptible reject): a non-preemptible job asking more than a guaranteed
        amount on its path can never start (see :meth:`guarantee_violation`)."""
        for n in self.path_of(queue):
            g = self.guaranteed[n]
            for r in range(4):
                if g[r] > 0 and nonpreemptible_refusal(0, ask[r], g[r]) == "never":
                    return (n, r)
        return None

    def guaranteed_dims(self, node: int) -> tuple[int, ...]:
        """Rule (guaranteed resources): a queue's guarantee covers the resources it has a
        guaranteed amount for; a queue with none has a guarantee of zero for every resource."""
        g = self.guaranteed[node]
        dims = tuple(r for r in range(4) if g[r] > 0)
        return dims or (0, 1, 2, 3)

    def exceeds_guaranteed(self, node: int, used: Sequence[int], extra: Sequence[int]) -> bool:
        """True when ``used`` + ``extra`` goes beyond the guarantee in a guaranteed resource
        that ``extra`` uses."""
        g = self.guaranteed[node]
        return any(extra[r] > 0 and used[r] + extra[r] > g[r] for r in self.guaranteed_dims(node))

    def within_guaranteed(self, queue: str, ask: Sequence[int]) -> bool:
        """Rule (reclaim eligibility): a job is within its guaranteed share iff its project's
        usage + ask stays within the project's guaranteed amounts (see :meth:`guaranteed_dims`).
        The tenant is not checked: its usage includes what its other projects borrowed, which is
        exactly what is being reclaimed."""
        pi = self.project_index.get(queue)
        if pi is None:
            return False
        return not self.exceeds_guaranteed(pi, self.usage[pi], ask)

    def share(self, node: int) -> float:
        """Rule (fair share): the dominant share of a queue is max over resources of usage ÷
        guaranteed, over the resources it has a guarantee for. A queue with no guarantee at all
        ranks after every guaranteed one, by its usage."""
        g = self.guaranteed[node]
        u = self.usage[node]
        best = 0.0
        any_g = False
        for r in range(4):
            if g[r] > 0:
                any_g = True
                s = u[r] / g[r]
                if s > best:
                    best = s
        if any_g:
            return best
        used = sum(1 for r in range(4) if u[r] > 0)
        return 1e9 + u[0] / 1000 + used


# --------------------------------------------------------------------------------------------------
# What a job and an allocation cost
# --------------------------------------------------------------------------------------------------


def grant_gpu_milli(g: GpuGrant, card_memory_mib: int) -> int:
    """Milli-GPUs a granted slice counts: the GPU unit, :func:`accounting.slice_milli`."""
    return accounting.grant_milli(g, card_memory_mib)


def placement_usage(
    pods: Iterable[PodPlacement], card_memory: Mapping[str, Sequence[int]]
) -> list[int]:
    """Exact resources held by placed pods (the granted, aligned slices), as a vector; GPUs in
    the unit of :mod:`accounting`."""
    v = [0, 0, 0, 0]
    for pp in pods:
        mems = card_memory.get(pp.node, ())
        for g in pp.gpus:
            cap = mems[g.index] if g.index < len(mems) else 0
            v[0] += accounting.grant_milli(g, cap)
            v[1] += cap if g.exclusive and cap else g.gpu_memory_mib
        v[2] += pp.cpu_millicores
        v[3] += pp.ram_mib
    return v


def pod_ask(p: PodRequest, smallest_card_mib: int) -> list[int]:
    """A lower bound of what a pod will be charged before it is placed: GPUs as
    :func:`accounting.pod_ask_milli` counts them; whole cards' memory as the smallest card's."""
    v = [accounting.pod_ask_milli(p), 0, p.cpu_millicores, p.ram_mib]
    for c in p.containers:
        if c.whole_cards:
            v[1] += smallest_card_mib * c.gpu_count
            continue
        mem = c.gpu_memory_mib
        if not mem and c.gpu_memory_percent:
            mem = math.ceil(c.gpu_memory_percent * smallest_card_mib / 100)
        v[1] += mem * c.gpu_count
    return v


def job_ask(job: Job, smallest_card_mib: int) -> list[int]:
    """Lower bound of a job's charge (all its pods), see :func:`pod_ask`."""
    v = [0, 0, 0, 0]
    for g in job.groups:
        a = pod_ask(g.template, smallest_card_mib)
        for r in range(4):
            v[r] += a[r] * g.replicas
    return v


# --------------------------------------------------------------------------------------------------
# Running jobs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running job as the queueing layer sees it: its pods' placements and what preemption and
    backfill need to know."""

    name: str
    pods: tuple[PodPlacement, ...]
    queue: str = ""
    priority: int = 0
    preemptible: bool = False
    checkpointable: bool = False
    start_time: float | None = None
    runtime_estimate_s: float | None = None

    @property
    def expected_end(self) -> float | None:
        """start + estimate, when both are known."""
        if self.start_time is None or self.runtime_estimate_s is None:
            return None
        return self.start_time + self.runtime_estimate_s


def running_jobs(
    snapshot: ClusterSnapshot,
    *,
    checkpointable: Iterable[str] = (),
    runtime_estimates: Mapping[str, float] | None = None,
) -> list[RunningJob]:
    """Group the snapshot's allocations by job (queue, priority, preemptibility and start time
    come from the job's first allocation)."""
    ck = set(checkpointable)
    est = runtime_estimates or {}
    pods: dict[str, list[PodPlacement]] = {}
    first: dict[str, Allocation] = {}
    for a in snapshot.allocations:
        pods.setdefault(a.job, []).append(a.placement)
        first.setdefault(a.job, a)
    out = []
    for name, pps in pods.items():
        a = first[name]
        out.append(
            RunningJob(
                name=name,
                pods=tuple(pps),
                queue=a.queue,
                priority=a.priority,
                preemptible=a.preemptible,
                checkpointable=name in ck,
                start_time=a.start_time,
                runtime_estimate_s=est.get(name),
            )
        )
    return out


def borrowing_jobs(
    tree: TreeState,
    usage_of: Mapping[str, Sequence[int]],
    running: Iterable[RunningJob],
    *,
    nonpreemptible_first: bool = False,
) -> set[str]:
    """Rule (borrowing): within a project, running jobs are counted against its guaranteed share in
    start order; a job whose cumulative usage exceeds the guaranteed amount of a guaranteed resource
    it uses is borrowing (so the most recently started jobs are the borrowers). Jobs of unknown queues
    borrow by definition.

    With ``nonpreemptible_first`` (the non-preemptible-within-guarantee rule), non-preemptible jobs
    are counted first: they hold the guaranteed share, and what the project runs beyond it is its
    preemptible jobs, which can then be reclaimed."""
    by_queue: dict[str, list[RunningJob]] = {}
    for rj in running:
        by_queue.setdefault(rj.queue, []).append(rj)
    out: set[str] = set()
    for q, jobs in by_queue.items():
        pi = tree.project_index.get(q)
        if pi is None:
            out.update(j.name for j in jobs)
            continue
        g = tree.guaranteed[pi]
        dims = tree.guaranteed_dims(pi)
        total = [0, 0, 0, 0]
        for j in jobs:
            u = usage_of[j.name]
            for r in range(4):
                total[r] += u[r]
        if all(total[r] <= g[r] for r in dims):
            continue  # all of the project's jobs together are within its guarantee: nobody borrows
        cum = [0, 0, 0, 0]
        if nonpreemptible_first:
            ordered = sorted(jobs, key=lambda j: (j.preemptible, j.start_time or 0.0, j.name))
        else:
            ordered = sorted(jobs, key=lambda j: (j.start_time or 0.0, j.name))
        for j in ordered:
            u = usage_of[j.name]
            if any(u[r] > 0 and cum[r] + u[r] > g[r] for r in dims):  # exceeds_guaranteed, inlined
                out.add(j.name)
            for r in range(4):
                cum[r] += u[r]
    return out


# --------------------------------------------------------------------------------------------------
# Ordering
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Aging:
    """Max-wait aging: a job pending for ``max_wait_s`` or longer is *aged*.

    Aged jobs are ordered before all others (oldest first), skipping priority and fair share, and a
    capacity-blocked aged job holds a backfill reservation, so nothing starves."""

    max_wait_s: float | None = None


def is_aged(job: Job, now: float, aging: Aging) -> bool:
    """Rule (aging): pending at least ``max_wait_s`` seconds."""
    return aging.max_wait_s is not None and now - job.submit_time >= aging.max_wait_s


def queue_order_key(job: Job, aged: bool) -> tuple[int, float, float, str]:
    """Rule (order within a project): aged first, then higher priority, then earlier submit."""
    if aged:
        return (0, 0.0, job.submit_time, job.name)
    return (1, -float(job.priority), job.submit_time, job.name)


class FairOrder:
    """Yields pending jobs in Camp's order, recomputing fair shares as jobs are admitted.

    Rule (ordering): aged jobs first, by submit time; then the jobs ``within`` their project's
    guarantee (the ones that may reclaim: :meth:`TreeState.within_guaranteed`), then the others
    (they would borrow); each of those two in bands of equal priority, highest first; within a
    band the tenant with the lowest dominant share goes first, within it the project with the
    lowest share, within it the earliest submitted job. Call :meth:`touch` after any change of a
    queue's usage so that its shares are refreshed.

    Guaranteed before borrowing, as Kueue orders its heads: a borrower ordered first took the
    room a reclaim had just freed for a job within its guarantee, which evicted it again in the
    next cycle — in the living demo a high-priority borrower was admitted and preempted 228
    times in three minutes while a notebook within its tenant's guarantee waited (issue 32)."""

    def __init__(self, tree: TreeState, jobs: Sequence[Job], now: float, aging: Aging,
                 within: Callable[[Job], bool] | None = None) -> None:
        self.tree = tree
        self._aged: list[Job] = []
        bands: dict[tuple[bool, int], list[Job]] = {}
        for j in jobs:
            if is_aged(j, now, aging):
                self._aged.append(j)
            else:
                bands.setdefault((within is not None and within(j), j.priority), []).append(j)
        self._aged.sort(key=lambda j: (j.submit_time, j.name))
        self._bands = [bands[k] for k in sorted(bands, reverse=True)]
        self._pver: dict[int, int] = {}
        self._tver: dict[int, int] = {}
        self._queues: dict[int, list[Job]] = {}
        self._pheap: dict[int, list[tuple[float, str, int, int]]] = {}
        self._theap: list[tuple[float, str, int, int]] = []

    def __iter__(self) -> Iterator[Job]:
        yield from self._aged
        for band in self._bands:
            yield from self._band(band)

    def _band(self, band: list[Job]) -> Iterator[Job]:
        tree = self.tree
        self._queues = {}
        for j in band:
            pi = tree.project_index.get(j.queue, -1)
            self._queues.setdefault(pi, []).append(j)
        for q in self._queues.values():
            q.sort(key=lambda j: (j.submit_time, j.name), reverse=True)  # pop() = earliest
        self._pheap = {}
        self._theap = []
        tenants: set[int] = set()
        for pi in self._queues:
            ti = tree.tenant_of.get(pi, -1)
            tenants.add(ti)
            self._push_project(pi, ti)
        for ti in tenants:
            self._push_tenant(ti)
        while self._theap:
            ts, tname, ti, tv = self._theap[0]
            if self._tver.get(ti, 0) != tv:
                heapq.heappop(self._theap)
                continue
            ph = self._pheap.get(ti, [])
            while ph and self._pver.get(ph[0][2], 0) != ph[0][3]:
                heapq.heappop(ph)
            if not ph:
                heapq.heappop(self._theap)
                continue
            pi = ph[0][2]
            q = self._queues[pi]
            job = q.pop()
            if not q:
                heapq.heappop(ph)
                del self._queues[pi]
            yield job

    def _share(self, node: int) -> float:
        return self.tree.share(node) if node >= 0 else 2e9

    def _push_project(self, pi: int, ti: int) -> None:
        v = self._pver.get(pi, 0) + 1
        self._pver[pi] = v
        if pi in self._queues:
            name = self.tree.names[pi] if pi >= 0 else ""
            heapq.heappush(self._pheap.setdefault(ti, []), (self._share(pi), name, pi, v))

    def _push_tenant(self, ti: int) -> None:
        v = self._tver.get(ti, 0) + 1
        self._tver[ti] = v
        name = self.tree.names[ti] if ti >= 0 else ""
        heapq.heappush(self._theap, (self._share(ti), name, ti, v))

    def touch(self, queue: str) -> None:
        """Refresh the shares of ``queue`` and its tenant after its usage changed."""
        pi = self.tree.project_index.get(queue)
        if pi is None:
            return
        ti = self.tree.tenant_of[pi]
        if pi in self._queues:
            self._push_project(pi, ti)
        if ti in self._pheap:
            self._push_tenant(ti)


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st ..."""
    if 10 <= n % 100 <= 20:
        suf = "th"
    else:
        suf = {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suf}"
