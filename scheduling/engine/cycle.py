"""One scheduling cycle with queueing: heads of queues → order → quota → place → preempt → backfill.

::

    pending jobs ──► FairOrder (aged · within guarantee · priority · fair share per level · submit time)
      per job:  reject?     shape no node can ever hold · ask above a limit · unknown queue ·
                            non-preemptible ask above a guarantee
                quota       usage + ask within the limit at project, tenant and cluster level;
                            a non-preemptible job also within the guarantee at each level
                place       Placer on the shared ClusterState, avoiding nodes held for waiting
                            large jobs (backfill), then the exact charge is checked again
                preempt     fewest eligible victims (priority, or reclaim of borrowed capacity)
                reserve     a capacity-blocked gang / large / aged job holds nodes (backfill)
      end:      every waiting job gets a reason a user can act on and its place in its queue

Admitted jobs are *borrowing* when their project runs beyond its guaranteed share; borrowing jobs
are the first victims when the owner of that capacity reclaims it. Only preemptible jobs borrow
(``CycleConfig.nonpreemptible_within_guarantee``): capacity a non-preemptible job held beyond its
guarantee could never be reclaimed, and would keep another project below its guaranteed share
while it has work waiting. The cycle performs no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduling.engine.candidates import enumerate_takes, fits_without
from scheduling.engine.fragmentation import shape_key
from scheduling.engine.guarantees import beyond_words
from scheduling.engine.model import (
    Admit,
    ClusterSnapshot,
    Decision,
    GpuRequest,
    Job,
    JobAffinity,
    Placement,
    PodPlacement,
    PodRequest,
    Preempt,
    Reject,
    Wait,
)
from scheduling.engine.placement import (
    Placer,
    describe_gpu_ask,
    node_filter,
    one_model_never_fits,
    one_model_variants,
    profile_for,
)
from scheduling.engine.policies import Policy, default_policy
from scheduling.engine.preemption import (
    Evictor,
    PreemptionConfig,
    fewest_victims_one_pod,
    may_preempt,
    minimal_victims,
    smallest_prefix,
    victim_key,
)
from scheduling.engine.queueing import (
    RESOURCE_NAMES,
    Aging,
    FairOrder,
    QueueTree,
    Resources,
    RunningJob,
    TreeState,
    borrowing_jobs,
    format_amount,
    is_aged,
    job_ask,
    ordinal,
    placement_usage,
    running_jobs,
)
from scheduling.engine.state import ClusterState, Demand, NodeState, align_demand

# --------------------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CycleConfig:
    """Knobs of one cycle."""

    aging: Aging = field(default_factory=Aging)
    preemption: PreemptionConfig = field(default_factory=PreemptionConfig)
    backfill: bool = True
    large_job_gpus: int = 2
    """A job is *large* (holds a backfill reservation while it waits) when one of its pods asks
    this many GPUs or more, or it is a gang of several pods."""
    max_reservations: int = 4
    """How many waiting jobs may hold nodes at once in one cycle."""
    heads_per_queue: int | None = None
    """Heads of queues: how many jobs at the front of each project queue are tried per cycle
    (None: all). The others are still checked for "never" and get a reason and a position; the
    service runs the next cycle while the previous one admitted something (Kueue-style)."""
    heads_fill: bool = False
    """Rule (heads follow the free room): on a cluster with room, each queue also offers the jobs
    behind its first ``heads_per_queue``, in its own order, while the jobs it offers ask less than
    its share of the free room — the free GPUs and the free CPU (:meth:`ClusterState.free_room`)
    divided by the queues with pending jobs, each job counted by its ask (:meth:`QueueCycle.ask`:
    GPUs in the one GPU unit, CPU millicores; the GPU share bounds only jobs that ask GPUs). A
    queue of small slices offers many jobs, a queue of 8-card jobs few; on a full cluster only
    the configured heads. (Counting jobs instead of what they ask took a burst of slices two
    cycles and more to reach the room, issue 35.)"""
    nonpreemptible_within_guarantee: bool = True
    """Rule (non-preemptible within guarantee): a non-preemptible job starts only if, with it, the
    non-preemptible usage of its project, tenant and cluster stays within each one's guaranteed
    amount of every resource it guarantees; beyond that only preemptible jobs borrow idle capacity,
    so that every guarantee can be reclaimed. Jobs already running are never evicted by it. Off:
    non-preemptible jobs borrow like any other (capacity they borrow cannot be reclaimed)."""


MAX_FILL_PASSES = 8
"""Passes of one cycle over the heads of queues, the first included (``CycleConfig.heads_fill``):
bounds a cycle's work when each pass admits only a few jobs into the last gaps."""


class Kind:
    """Why a job got its decision (machine-readable; the reason text is for people)."""

    ADMITTED = "admitted"
    PREEMPTING = "preempting"
    QUOTA = "quota"
    GUARANTEE = "guarantee"
    """A non-preemptible job waiting until it fits within its queues' guarantees."""
    CAPACITY = "capacity"
    NEVER_FITS = "never-fits"
    OVER_LIMIT = "over-limit"
    OVER_GUARANTEE = "over-guarantee"
    """A non-preemptible job asking more than a guarantee on its path: it can never start."""
    UNKNOWN_QUEUE = "unknown-queue"
    BEHIND = "behind"


@dataclass(frozen=True, slots=True)
class JobStatus:
    """One pending job's outcome: its decision, why, and where it stands in its queue."""

    job: str
    queue: str
    decision: Decision
    kind: str
    position: int = 0
    """1-based place among the jobs still waiting in its project queue; 0 when not waiting."""
    queue_length: int = 0
    borrowing: bool = False
    """Admitted beyond its project's guaranteed share (first in line to be reclaimed)."""
    backfilled: bool = False
    """Admitted while a larger job ahead of it waits (without delaying it)."""
    reserved_nodes: int = 0
    """For a waiting large job: how many nodes are held for it."""


@dataclass(frozen=True, slots=True)
class CycleResult:
    """Decisions in the order they were taken, and a status per pending job."""

    decisions: tuple[Decision, ...]
    statuses: dict[str, JobStatus]
    usage: dict[str, Resources]
    """Usage of every queue (tenants, projects and the cluster) after the cycle."""
    borrowing: frozenset[str]
    """Running jobs (including the ones admitted now) that are borrowing after the cycle."""
    evicted: tuple[str, ...] = ()


@dataclass(slots=True)
class _Reservation:
    job: str
    nodes: frozenset[str]
    shadow: float | None
    """When the waiting job is expected to start (from runtime estimates), if known."""


# --------------------------------------------------------------------------------------------------
# The cycle
# --------------------------------------------------------------------------------------------------


class QueueCycle:
    """Runs one cycle on a live :class:`ClusterState` (the state is updated with the decisions,
    so a simulator can keep one state and one placer across cycles)."""

    def __init__(
        self,
        tree: QueueTree,
        placer: Placer,
        running: Sequence[RunningJob],
        *,
        now: float,
        config: CycleConfig | None = None,
    ) -> None:
        self.config = config or CycleConfig()
        self.placer = placer
        self.state: ClusterState = placer.state
        self.now = now
        self.tree = TreeState(tree)
        self.running: dict[str, RunningJob] = {r.name: r for r in running}
        self.card_memory: dict[str, list[int]] = {
            name: [g.device.memory_mib for g in ns.static.gpus]
            for name, ns in self.state.nodes.items()
        }
        mems = [m for ms in self.card_memory.values() for m in ms]
        self.smallest_card = min(mems) if mems else 0
        self.usage_of: dict[str, list[int]] = {}
        self.np_rule = self.config.nonpreemptible_within_guarantee
        self._by_queue: dict[str, set[str]] = {}
        """Running jobs per queue (to recount a project's borrowing jobs)."""
        for r in running:
            u = placement_usage(r.pods, self.card_memory)
            self.usage_of[r.name] = u
            self.tree.charge(r.queue, u, nonpreemptible=not r.preemptible)
            self._by_queue.setdefault(r.queue, set()).add(r.name)
        self.borrowing: set[str] = borrowing_jobs(
            self.tree, self.usage_of, running, nonpreemptible_first=self.np_rule
        )
        self.reservations: list[_Reservation] = []
        self._fail_memo: dict[tuple[object, ...], int] = {}
        self._failed_at: dict[tuple[object, ...], int] = {}
        """Job shape → evictions so far when it last failed to fit. Within a cycle room only
        shrinks but for evictions, so a shape that failed since the last eviction fails again
        (``_refill`` does not offer it)."""
        self._sorted: dict[str, list[Job]] | None = None
        self._never_memo: dict[tuple[object, ...], tuple[str | None, tuple[int, ...]]] = {}
        self._limit_memo: dict[tuple[object, ...], str | None] = {}
        self._guarantee_memo: dict[tuple[object, ...], str | None] = {}
        self._preempt_memo: dict[tuple[object, ...], int] = {}
        self._host_cache: dict[tuple[int, PodRequest], bool] = {}
        self._shapes: dict[str, tuple[Job, tuple[PodRequest, ...]]] = {}
        """Job name → (the job, its pods) (``_pods``)."""
        self.evictor = Evictor(self.state)
        self.evicted: list[str] = []
        self._evicted_queue: dict[str, str] = {}
        self._reserved_count: dict[str, int] = {}
        self._demand_cache: dict[tuple[object, ...], list[tuple[int, Demand]]] = {}
        self._pool: list[RunningJob] | None = None
        self._victims_memo: dict[tuple[object, ...], tuple[int, list[RunningJob]]] = {}
        self._running_version = 0
        self._released_borrowing: set[str] = set()
        self.admitted_now: set[str] = set()
        """Jobs admitted in this cycle; never victims in the same cycle."""
        self.filling = False
        """In a refill pass (``heads_fill``): jobs are admitted into the free room only; one that
        does not fit waits without searching for victims (it may preempt as a head of the
        next cycle), so filling the last gaps of a full cluster costs no preemption search. Nor
        does it use the nodes of this cycle's victims: their pods hold the room until they stop,
        and the write would refuse an admission there ("taken concurrently")."""
        self._evicted_nodes: dict[str, frozenset[str]] = {}
        """Evicted job → the nodes its pods run on (while the eviction stands)."""

    # -- the loop ------------------------------------------------------------------------------

    def run(self, pending: Sequence[Job]) -> CycleResult:
        """Decide every pending job, in Camp's order.

        With ``heads_fill``, a pass over the heads that admitted something and left room is
        followed by another over the jobs behind them (``_refill``), as the next cycle would be
        but on this cycle's state and without preemption (``filling``): a burst's last gaps
        are filled without another snapshot and write (issue 35). At most
        ``MAX_FILL_PASSES``; the next cycle goes on from there."""
        heads, rest = self.heads(pending)
        provisional: dict[str, tuple[Decision, str, bool, bool]] = {}
        waiting: list[tuple[Job, str, tuple[object, ...] | None]] = []
        behind: list[Job] = []
        for job in rest:
            d, kind = self.check_never(job)
            if d is None:
                d, kind = Wait(job.name, ""), Kind.BEHIND
                behind.append(job)
            provisional[job.name] = (d, kind, False, False)
        passes = 0
        while heads:
            passes += 1
            admitted = self._pass(heads, provisional, waiting)
            if not (self.config.heads_fill and admitted and behind) or passes >= MAX_FILL_PASSES:
                break
            self.filling = True
            heads = self._refill(behind)
            if heads:
                taken = {j.name for j in heads}
                behind = [j for j in behind if j.name not in taken]
                for j in heads:
                    # Decided in this pass: its place in the decisions follows the earlier ones'.
                    del provisional[j.name]
        self.filling = False
        waiting.extend((job, Kind.BEHIND, None) for job in behind)
        statuses = self._finish(pending, provisional, waiting)
        final = tuple(statuses[j].decision for j in provisional)
        usage = {self.tree.names[i]: Resources.from_vec(u) for i, u in enumerate(self.tree.usage)}
        return CycleResult(
            decisions=final,
            statuses=statuses,
            usage=usage,
            borrowing=frozenset(self.borrowing),
            evicted=tuple(self.evicted),
        )

    def _pass(self, heads: list[Job], provisional: dict[str, tuple[Decision, str, bool, bool]],
              waiting: list[tuple[Job, str, tuple[object, ...] | None]]) -> int:
        """One pass over ``heads`` in fair order (:class:`FairOrder`); how many it admitted."""
        order = FairOrder(self.tree, heads, self.now, self.config.aging,
                          within=lambda j: self.tree.within_guaranteed(j.queue, self.ask(j)))
        admitted = 0
        for job in order:
            d, kind, borrowing, backfilled, ctx = self.decide(job)
            provisional[job.name] = (d, kind, borrowing, backfilled)
            if isinstance(d, Admit | Preempt):
                admitted += isinstance(d, Admit)
                order.touch(job.queue)
                if isinstance(d, Preempt):
                    for v in d.victims:
                        order.touch(self._evicted_queue[v])
            elif isinstance(d, Wait):
                waiting.append((job, kind, ctx))
        return admitted

    def heads(self, pending: Sequence[Job]) -> tuple[list[Job], list[Job]]:
        """Rule (heads of queues): the first ``heads_per_queue`` jobs of each project queue, in
        the queue's own order (aged, priority, submit time), are tried this cycle; with
        ``heads_fill``, more while they ask less than the queue's share of the free room."""
        k = self.config.heads_per_queue
        if k is None:
            return list(pending), []
        return self._cut(self._queue_order(pending).values(), k)

    def _refill(self, behind: list[Job]) -> list[Job]:
        """The next heads after a pass (``heads_fill``): of the jobs still behind, each queue's
        that ask less than its share of the room left now (no configured minimum: on a full
        cluster, none), leaving out those of a shape that failed to fit since the last eviction
        (it would fail again; it is tried in the next cycle)."""
        evictions = len(self.evicted)
        names = {j.name for j in behind
                 if self._failed_at.get(self._job_shape(j, self._pods(j)), -1) != evictions}
        queues = [[j for j in jobs if j.name in names] for jobs in self._queue_order(behind).values()]
        return self._cut([q for q in queues if q], 0)[0]

    def _cut(self, queues: Iterable[list[Job]], k: int) -> tuple[list[Job], list[Job]]:
        """Each queue's first ``k`` jobs, then (``heads_fill``) those that fit its share of the
        free room by their asks; the heads and the rest."""
        queues = list(queues)
        gpu_share = cpu_share = 0
        if self.config.heads_fill and queues:
            free_milli, free_cpu = self.state.free_room()
            gpu_share, cpu_share = -(-free_milli // len(queues)), -(-free_cpu // len(queues))
        heads: list[Job] = []
        rest: list[Job] = []
        # A job that asks no CPU counts a hundredth of the CPU share, so a queue of such jobs
        # offers at most a hundred more per pass.
        least_cpu = max(1, cpu_share // 100)
        for jobs in queues:
            n = min(k, len(jobs))
            if cpu_share and n < len(jobs):
                gpu = cpu = 0
                for j in jobs[:n]:
                    a = self.ask(j)
                    gpu, cpu = gpu + a[0], cpu + max(a[2], least_cpu)
                # In queue order, while the CPU share lasts and, for a job that asks GPUs, the
                # GPU share (a cluster with CPU but no GPU left still takes CPU-only jobs).
                while n < len(jobs) and cpu < cpu_share:
                    a = self.ask(jobs[n])
                    if a[0] and gpu >= gpu_share:
                        break
                    gpu, cpu, n = gpu + a[0], cpu + max(a[2], least_cpu), n + 1
            heads.extend(jobs[:n])
            rest.extend(jobs[n:])
        return heads, rest

    def _queue_order(self, jobs: Iterable[Job]) -> dict[str, list[Job]]:
        """Jobs grouped by project queue, each queue in its own order (:func:`queue_order_key`).
        The pending jobs' order is computed once per cycle and reused for positions."""
        if self._sorted is not None:
            return self._sorted
        wait = self.config.aging.max_wait_s
        now = self.now
        by_queue: dict[str, list[tuple[tuple[int, float, float, str], Job]]] = {}
        for j in jobs:
            aged = wait is not None and now - j.submit_time >= wait  # is_aged, inlined
            key = (0, 0.0, j.submit_time, j.name) if aged else (1, -float(j.priority), j.submit_time, j.name)
            by_queue.setdefault(j.queue, []).append((key, j))
        out: dict[str, list[Job]] = {}
        for q, items in by_queue.items():
            items.sort(key=_first)
            out[q] = [j for _, j in items]
        self._sorted = out
        return out

    def check_never(self, job: Job) -> tuple[Decision | None, str]:
        """Rule (reject): no pods, an unknown queue, a shape no node can ever hold, or an ask
        above a limit on the job's path can never run.

        The verdicts depend only on the job's shape (and, for limits, its queue), so each is
        computed once per distinct shape or (ask, queue) in a cycle; pending jobs have few."""
        tree = self.tree
        shape = job_shape(job)
        hit = self._never_memo.get(shape)
        if hit is None:
            hit = self._shape_verdict(job)
            self._never_memo[shape] = hit
        msg, ask = hit
        if msg is not None:
            return Reject(job.name, msg), Kind.NEVER_FITS
        if tree.project_index and job.queue not in tree.project_index:
            return (
                Reject(job.name, f"Queue {job.queue or '(none)'} does not exist on this cluster"),
                Kind.UNKNOWN_QUEUE,
            )
        key = (ask, job.queue)
        over_msg = self._limit_memo.get(key, _MISSING)
        if over_msg is _MISSING:
            over_msg = self._over_limit(job.queue, ask)
            self._limit_memo[key] = over_msg
        if over_msg is not None:
            return Reject(job.name, over_msg), Kind.OVER_LIMIT
        if self.np_rule and not job.preemptible:
            g_msg = self._guarantee_memo.get(key, _MISSING)
            if g_msg is _MISSING:
                g_msg = self._over_guarantee(job.queue, ask)
                self._guarantee_memo[key] = g_msg
            if g_msg is not None:
                return Reject(job.name, g_msg), Kind.OVER_GUARANTEE
        return None, ""

    def _shape_verdict(self, job: Job) -> tuple[str | None, tuple[int, ...]]:
        """(why the job's shape can never run or None, its charge lower bound)."""
        pods = self._pods(job)
        ask = tuple(job_ask(job, self.smallest_card))
        if not pods:
            return "The job has no pods", ask
        return self.never_fits(job, pods), ask

    def _over_limit(self, queue: str, ask: Sequence[int]) -> str | None:
        tree = self.tree
        over = tree.never_within_limit(queue, ask)
        if over is None:
            return None
        n, r = over
        lim = tree.limit[n][r]
        assert lim is not None
        return (
            f"The job asks {format_amount(r, ask[r])} {RESOURCE_NAMES[r]}, more than "
            f"{tree.label(n)}'s {RESOURCE_NAMES[r]} limit of {format_amount(r, lim)}"
        )

    def _over_guarantee(self, queue: str, ask: Sequence[int]) -> str | None:
        """Why a non-preemptible job can never start within its guarantees (or None)."""
        tree = self.tree
        over = tree.never_within_guarantee(queue, ask)
        if over is None:
            return None
        n, r = over
        g = tree.guaranteed[n][r]
        return (
            f"Non-preemptible jobs must fit within {tree.label(n)}'s {RESOURCE_NAMES[r]} "
            f"guarantee of {format_amount(r, g)}, and the job asks {format_amount(r, ask[r])}; "
            f"{beyond_words(_borrow_what(r))}"
        )

    def ask(self, job: Job) -> tuple[int, ...]:
        """The job's charge lower bound (:func:`job_ask`), cached per job shape."""
        shape = job_shape(job)
        hit = self._never_memo.get(shape)
        if hit is None:
            hit = self._shape_verdict(job)
            self._never_memo[shape] = hit
        return hit[1]

    def decide(self, job: Job) -> tuple[Decision, str, bool, bool, tuple[object, ...] | None]:
        """One job: reject → quota → place → preempt → reserve."""
        never, kind = self.check_never(job)
        if never is not None:
            return never, kind, False, False, None
        pods = self._pods(job)
        ask = self.ask(job)
        blocked = self.admission_block(job, ask)
        if blocked is not None:
            if blocked[0] == Kind.QUOTA and not self.filling:
                pre = self.try_preempt_within_limit(job, pods, ask)
                if pre is not None:
                    return pre, Kind.PREEMPTING, job.name in self.borrowing, False, None
            return Wait(job.name, blocked[1]), blocked[0], False, False, None
        exclude, bypassed = self.held_nodes(job)
        if self.filling and self._evicted_nodes:
            exclude = exclude.union(*self._evicted_nodes.values())
        placement = self.try_place(job, pods, exclude)
        if placement is not None:
            u = placement_usage(placement.pods, self.card_memory)
            blocked = self.admission_block(job, u)
            if blocked is not None:
                for pp in placement.pods:
                    self.state.unreserve(pp)
                return Wait(job.name, blocked[1]), blocked[0], False, False, None
            borrowing = self.admit(job, placement, u)
            backfilled = bool(self.reservations)
            return Admit(job.name, placement), Kind.ADMITTED, borrowing, backfilled, None
        pre = None if self.filling else self.try_preempt(job, pods, ask, exclude)
        if pre is not None:
            return pre, Kind.PREEMPTING, job.name in self.borrowing, False, None
        self.maybe_reserve(job, pods)
        return Wait(job.name, ""), Kind.CAPACITY, False, False, (frozenset(exclude),)

    # -- steps ---------------------------------------------------------------------------------

    def _pods(self, job: Job) -> tuple[PodRequest, ...]:
        """The job's pods, expanded once per cycle (a refill pass looks at every job behind)."""
        hit = self._shapes.get(job.name)
        if hit is not None and hit[0] is job:
            return hit[1]
        pods = job.pods()
        self._shapes[job.name] = (job, pods)
        return pods

    def never_fits(self, job: Job, pods: Sequence[PodRequest]) -> str | None:
        """Rule (reject): a pod no node could hold even when empty can never run; say which
        dimension is too large, against the largest node that could take it."""
        seen: set[PodRequest] = set()
        for p in pods:
            s = shape_key(p)
            if s in seen:
                continue
            seen.add(s)
            if self.placer.never_fits(p) is None:
                continue
            return "No node can ever fit: " + self._never_detail(p)
        if job.affinity == JobAffinity.SAME_NODE and len(pods) > 1:
            # r4sng: the placer's same-node rule (each node emptied, the same policy), as
            # ``Placer.place_job`` applies it; without it such a job waited forever, holding
            # nodes for a gang that no node could ever take whole.
            same = self.placer._affinity_never_fits(job, pods)
            if same is not None:
                return "No node can ever fit: " + same
        if job.affinity == JobAffinity.DISTINCT_NODES and len(pods) > 1:
            hosts = self._distinct_hosts(pods)
            if hosts < len(pods):
                return (
                    f"No node set can ever fit: the job needs {len(pods)} distinct nodes and "
                    f"only {hosts} could hold its pods"
                )
        why, _ = one_model_never_fits(job, pods, self.state, lambda v: self._can_hold(job, v))
        if why is not None:
            return why[0].upper() + why[1:]
        return None

    def _distinct_hosts(self, pods: Sequence[PodRequest]) -> int:
        return sum(1 for ns in self.state.nodes.values() if all(self.could_host(ns, p) for p in pods))

    def _can_hold(self, job: Job, pods: Sequence[PodRequest]) -> bool:
        """Could these pods (one model family's variant of the job) ever run: each fits an empty
        node, and a distinct-nodes job finds as many such nodes as pods."""
        if any(self.placer.never_fits(p) is not None for p in {shape_key(p) for p in pods}):
            return False
        return not (job.affinity == JobAffinity.DISTINCT_NODES and len(pods) > 1
                    and self._distinct_hosts(pods) < len(pods))

    def _never_detail(self, p: PodRequest) -> str:
        nodes = [ns.static.node for ns in self.state.nodes.values()]
        if p.arches:
            # Its image's platforms (the registry catalog): only nodes of those architectures count.
            fit = [n for n in nodes if n.arch in p.arches]
            if not fit:
                built = ", ".join(sorted(f"linux/{a}" for a in p.arches))
                have = ", ".join(sorted({f"linux/{n.arch}" for n in nodes})) or "none"
                return (f"its image's architecture does not match: the image catalog records it as "
                        f"built for {built} only, and this cluster's nodes are {have}")
            nodes = fit
        gpus = p.gpu_count
        if p.containers:
            allowed = [sum(1 for g in n.gpus if p.allows_model(g.model)) for n in nodes]
            most = max(allowed, default=0)
            if most == 0:
                models = ", ".join(sorted(p.gpu_models)) or "any"
                return f"no node has a GPU of an allowed model ({models})"
            per_container = max(c.gpu_count for c in p.containers)
            if per_container > most:
                return f"{per_container} GPUs per pod, the largest node has {most}"
        cpu = max((n.cpu_millicores for n in nodes), default=0)
        if p.cpu_millicores > cpu:
            return f"{p.cpu_millicores / 1000:g} CPU cores per pod, the largest node has {cpu / 1000:g}"
        ram = max((n.ram_mib for n in nodes), default=0)
        if p.ram_mib > ram:
            return f"{p.ram_mib} MiB RAM per pod, the largest node has {ram} MiB"
        return f"{describe_gpu_ask(p)} per pod ({gpus} GPUs) is larger than any GPU or node allows"

    def quota_reason(self, job: Job, ask: Sequence[int]) -> str | None:
        """Rule (quota): wait while usage + ask would exceed a limit on the job's path."""
        v = self.tree.quota_violation(job.queue, ask)
        if v is None:
            return None
        n, r = v
        lim = self.tree.limit[n][r]
        assert lim is not None
        used = self.tree.usage[n][r]
        name = RESOURCE_NAMES[r]
        return (
            f"{self.tree.label(n)} would exceed its {name} limit "
            f"({format_amount(r, used)} of {format_amount(r, lim)} in use, "
            f"job asks {format_amount(r, ask[r])})"
        )

    def guarantee_reason(self, job: Job, ask: Sequence[int]) -> str | None:
        """Rule (non-preemptible within guarantee): a non-preemptible job waits while, with it, the
        non-preemptible usage of a queue on its path would go beyond that queue's guarantee
        (:meth:`TreeState.guarantee_violation`); the reason names the queue, the resource, the
        amounts and what the user can do. Preemptible jobs, and every job when
        ``CycleConfig.nonpreemptible_within_guarantee`` is off, are not restricted."""
        if job.preemptible or not self.np_rule:
            return None
        tree = self.tree
        v = tree.guarantee_violation(job.queue, ask)
        if v is None:
            return None
        n, r = v
        return (
            f"Non-preemptible jobs must fit within {tree.label(n)}'s {RESOURCE_NAMES[r]} "
            f"guarantee of {format_amount(r, tree.guaranteed[n][r])} (non-preemptible jobs hold "
            f"{format_amount(r, tree.np_usage[n][r])}"
            f"{_over_already(tree.np_usage[n][r], tree.guaranteed[n][r])}; job asks "
            f"{format_amount(r, ask[r])}); {beyond_words(_borrow_what(r))}"
        )

    def admission_block(self, job: Job, amount: Sequence[int]) -> tuple[str, str] | None:
        """(kind, reason) when ``amount`` charged to the job's queues would break a limit
        (:meth:`quota_reason`) or, for a non-preemptible job, a guarantee
        (:meth:`guarantee_reason`); None when it may start."""
        q = self.quota_reason(job, amount)
        if q is not None:
            return Kind.QUOTA, q
        g = self.guarantee_reason(job, amount)
        if g is not None:
            return Kind.GUARANTEE, g
        return None

    def held_nodes(self, job: Job) -> tuple[frozenset[str], int]:
        """Rule (backfill): a job ordered after a waiting large job may not use the nodes held for
        it, unless its runtime estimate shows it ends before that job is expected to start."""
        if not self.reservations:
            return frozenset(), 0
        held: set[str] = set()
        bypassed = 0
        est = job.runtime_estimate_s
        for r in self.reservations:
            if r.shadow is not None and est is not None and self.now + est <= r.shadow:
                bypassed += 1
                continue
            held |= r.nodes
        return frozenset(held), bypassed

    def try_place(
        self, job: Job, pods: Sequence[PodRequest], exclude: frozenset[str]
    ) -> Placement | None:
        """Rule (placement): place every pod with the placer (all or nothing for a gang, at least
        one pod otherwise), avoiding ``exclude``; the placement stays reserved. A job shape that
        failed on this very state is not tried again."""
        key = (self._job_shape(job, pods), exclude)
        if self._fail_memo.get(key) == self.state.version:
            return None
        placed = self._place(job, pods, exclude)
        if placed is None:
            self._fail_memo[key] = self.state.version
            if not exclude:
                self._failed_at[key[0]] = len(self.evicted)
        return placed

    def _job_shape(self, job: Job, pods: Sequence[PodRequest]) -> tuple[object, ...]:
        """What decides where a job can be placed: its pods' shapes, gang flag, affinity and
        whether it may mix GPU models (the failure, preemption and reason memos key on it)."""
        return (tuple(shape_key(p) for p in pods), job.gang, job.affinity, job.mixed_gpu_models)

    def _place(
        self, job: Job, pods: Sequence[PodRequest], exclude: frozenset[str]
    ) -> Placement | None:
        """Rule (one GPU model per job): each allowed model in turn (``one_model_variants``)."""
        for variant in one_model_variants(job, pods, self.state, self.placer):
            placed = self._place_as_is(job, variant, exclude)
            if placed is not None:
                return placed
        return None

    def _place_as_is(
        self, job: Job, pods: Sequence[PodRequest], exclude: frozenset[str]
    ) -> Placement | None:
        placer = self.placer
        if job.affinity == JobAffinity.SAME_NODE and len(pods) > 1:
            for _, name, _ in placer.ranked(pods[0], exclude=exclude)[:64]:
                done: list[PodPlacement] = []
                for p in pods:
                    pp = placer.find(p, only=(name,))
                    if pp is None:
                        break
                    self.state.reserve(pp, check=False)
                    done.append(pp)
                if len(done) == len(pods):
                    return Placement(tuple(done))
                for pp in reversed(done):
                    self.state.unreserve(pp)
            return None
        distinct = job.affinity == JobAffinity.DISTINCT_NODES
        used: set[str] = set()
        placed: list[PodPlacement] = []
        for p in pods:
            ex: frozenset[str] | set[str] = (exclude | used) if distinct else exclude
            pp = placer.find(p, exclude=ex)
            if pp is None:
                if job.gang:
                    for done_pp in reversed(placed):
                        self.state.unreserve(done_pp)
                    return None
                continue
            self.state.reserve(pp, check=False)
            placed.append(pp)
            used.add(pp.node)
        return Placement(tuple(placed)) if placed else None

    def admit(self, job: Job, placement: Placement, usage: list[int]) -> bool:
        """Rule (borrowing mark): charge the job to its queues; it is borrowing when its project's
        usage now exceeds the guaranteed amount of a guaranteed resource the job uses. Under the
        non-preemptible-within-guarantee rule a non-preemptible job counts first against the
        guarantee, so its admission may turn the project's preemptible jobs into borrowers
        (:meth:`recount_borrowing`)."""
        nonpreemptible = not job.preemptible
        self.tree.charge(job.queue, usage, nonpreemptible=nonpreemptible)
        rj = RunningJob(
            name=job.name,
            pods=placement.pods,
            queue=job.queue,
            priority=job.priority,
            preemptible=job.preemptible,
            checkpointable=job.checkpointable,
            start_time=self.now,
            runtime_estimate_s=job.runtime_estimate_s,
        )
        self.running[job.name] = rj
        self.usage_of[job.name] = usage
        self._by_queue.setdefault(job.queue, set()).add(job.name)
        self.admitted_now.add(job.name)
        pi = self.tree.project_index.get(job.queue)
        if pi is None:
            borrowing = bool(self.tree.project_index)
        elif nonpreemptible and self.np_rule:
            self.recount_borrowing(job.queue)
            return job.name in self.borrowing
        else:
            before = [u - a for u, a in zip(self.tree.usage[pi], usage, strict=True)]
            borrowing = self.tree.exceeds_guaranteed(pi, before, usage)
        if borrowing:
            self.borrowing.add(job.name)
        return borrowing

    def recount_borrowing(self, queue: str) -> None:
        """Recount which of a project's running jobs borrow (:func:`borrowing_jobs`, non-preemptible
        jobs first); when that changes, the victim lists are rebuilt."""
        names = self._by_queue.get(queue, set())
        jobs = [self.running[n] for n in names]
        new = borrowing_jobs(self.tree, self.usage_of, jobs, nonpreemptible_first=True)
        old = {n for n in names if n in self.borrowing}
        if new == old:
            return
        self.borrowing -= old
        self.borrowing |= new
        self._pool = None
        self._victims_memo.clear()

    # -- preemption ----------------------------------------------------------------------------

    def try_preempt(
        self, job: Job, pods: Sequence[PodRequest], ask: Sequence[int], exclude: frozenset[str]
    ) -> Preempt | None:
        """Rule (preemption): a job that does not fit may evict the fewest eligible running jobs
        (see :mod:`scheduling.engine.preemption`) if it then fits; it is then charged and
        reserved, and the victims are released and uncharged."""
        cfg = self.config.preemption
        if not cfg.enabled or not self.running:
            return None
        reclaiming = self.tree.within_guaranteed(job.queue, ask)
        memo_key = (
            self._job_shape(job, pods),
            job.priority,
            reclaiming,
            job.queue if reclaiming else "",
            exclude,
        )
        if self._preempt_memo.get(memo_key) == self.state.version:
            return None
        cands = self.eligible_victims(job, reclaiming)
        if exclude:
            cands = [v for v in cands if not all(pp.node in exclude for pp in v.pods)]
        if not cands:
            self._preempt_memo[memo_key] = self.state.version
            return None
        version = self.state.version

        def fits() -> bool:
            p = self._place(job, pods, exclude)
            if p is None:
                return False
            for pp in p.pods:
                self.state.unreserve(pp)
            return True

        if len(pods) == 1:
            pod = pods[0]

            def fits_on(node: str) -> bool:
                return node not in exclude and self.placer.find(pod, only=(node,)) is not None

            def could_fit(node: str, victims: list[RunningJob]) -> bool:
                if node in exclude:
                    return False
                gone = [pp for v in victims for pp in v.pods]
                return fits_without(self.state.nodes[node], pod, gone)

            victims = fewest_victims_one_pod(
                self.evictor,
                cands,
                lambda v: {pp.node for pp in v.pods},
                fits_on,
                cfg.max_node_trials,
                could_fit,
            )
        else:
            victims = minimal_victims(self.evictor, cands, fits)
        if victims is None:
            self._preempt_memo[memo_key] = version
            return None
        placement = self._place(job, pods, exclude)
        if placement is None:  # cannot happen: the victims were chosen so that it fits
            for v in victims:
                self.evictor.restore(v)
            self._preempt_memo[memo_key] = version
            return None
        u = placement_usage(placement.pods, self.card_memory)
        for v in victims:
            self._release(v)
        if self.admission_block(job, u) is not None:
            for pp in placement.pods:
                self.state.unreserve(pp)
            for v in victims:
                self._unrelease(v)
            return None
        self.admit(job, placement, u)
        return Preempt(job.name, tuple(v.name for v in victims), placement)

    def try_preempt_within_limit(
        self, job: Job, pods: Sequence[PodRequest], ask: Sequence[int]
    ) -> Preempt | None:
        """Rule (preemption within a limit): a job held back by a limit of its project, its
        tenant or the cluster may evict lower-priority preemptible jobs charged to that
        limit (Kueue's ``withinClusterQueue: LowerPriority``): the fewest, in preference
        order (:func:`victim_key`), such that the job then stays within every limit on its
        path and fits on the nodes. Nobody is evicted when that is not enough. Without this
        rule a limit held by a tenant's own batch jobs would keep its urgent job waiting
        until they end, however low their priority."""
        cfg = self.config.preemption
        if not cfg.enabled or not self.running:
            return None
        violation = self.tree.quota_violation(job.queue, ask)
        if violation is None:
            return None
        limited = violation[0]
        cands = [v for v in self.eligible_victims(job, reclaiming=False)
                 if limited in self.tree.path_of(v.queue)]
        if not cands:
            return None
        exclude, _ = self.held_nodes(job)

        def ok() -> bool:
            if self.tree.quota_violation(job.queue, ask) is not None:
                return False
            p = self._place(job, pods, exclude)
            if p is None:
                return False
            for pp in p.pods:
                self.state.unreserve(pp)
            return True

        chosen: list[RunningJob] = []
        for v in cands:
            self.evictor.remove(v)
            self._release(v)
            chosen.append(v)
            if ok():
                break
        else:
            for v in reversed(chosen):
                self._unrelease(v)
            return None
        for v in reversed(list(chosen)):  # give back every victim not needed after all
            self._unrelease(v)
            if ok():
                chosen.remove(v)
                continue
            self.evictor.remove(v)
            self._release(v)
        placement = self._place(job, pods, exclude)
        u = placement_usage(placement.pods, self.card_memory) if placement is not None else list(ask)
        if placement is None or self.admission_block(job, u) is not None:
            if placement is not None:
                for pp in placement.pods:
                    self.state.unreserve(pp)
            for v in reversed(chosen):
                self._unrelease(v)
            return None
        self.admit(job, placement, u)
        return Preempt(job.name, tuple(v.name for v in chosen), placement)

    def eligible_victims(self, job: Job, reclaiming: bool) -> list[RunningJob]:
        """The running jobs ``job`` may evict (:func:`may_preempt`), in preference order
        (:func:`victim_key`). Eligibility depends only on the preemptor's priority, queue and
        whether it reclaims, so the list is kept per such key until a job is evicted or restored."""
        key = (job.priority, reclaiming, job.queue if reclaiming else "")
        hit = self._victims_memo.get(key)
        if hit is not None:
            if hit[0] != self._running_version:  # jobs were evicted since: drop them
                hit = (self._running_version, [v for v in hit[1] if v.name in self.running])
                self._victims_memo[key] = hit
            return hit[1]
        if self._pool is None:
            self._pool = sorted(
                (v for v in self.running.values() if v.preemptible),
                key=lambda v: victim_key(v, v.name in self.borrowing),
            )
        cfg = self.config.preemption
        cands = [
            v
            for v in self._pool
            if v.name in self.running
            and v.name not in self.admitted_now
            and may_preempt(
                job,
                v,
                now=self.now,
                reclaiming=reclaiming,
                victim_borrowing=v.name in self.borrowing,
                min_runtime_s=cfg.min_runtime_s,
            )
        ]
        self._victims_memo[key] = (self._running_version, cands)
        return cands

    def _release(self, v: RunningJob) -> None:
        self._running_version += 1
        self.tree.charge(v.queue, self.usage_of[v.name], -1)
        del self.running[v.name]
        self._by_queue[v.queue].discard(v.name)
        if v.name in self.borrowing:
            self.borrowing.discard(v.name)
            self._released_borrowing.add(v.name)
        self.evicted.append(v.name)
        self._evicted_queue[v.name] = v.queue
        self._evicted_nodes[v.name] = frozenset(pp.node for pp in v.pods)

    def _unrelease(self, v: RunningJob) -> None:
        self._running_version += 1
        self._victims_memo.clear()  # a restored job may be a candidate again
        self.tree.charge(v.queue, self.usage_of[v.name])
        self.running[v.name] = v
        self._by_queue.setdefault(v.queue, set()).add(v.name)
        if v.name in self._released_borrowing:
            self.borrowing.add(v.name)  # it borrows again, as before its trial release
        self.evicted.remove(v.name)
        self._evicted_nodes.pop(v.name, None)
        self.evictor.restore(v)

    # -- backfill reservations -----------------------------------------------------------------

    def is_large(self, job: Job, pods: Sequence[PodRequest]) -> bool:
        """Rule (large job): a gang of several pods, or a pod asking ``large_job_gpus`` GPUs or
        more, or an aged job, holds nodes while it waits."""
        if job.gang and len(pods) > 1:
            return True
        if any(p.gpu_count >= self.config.large_job_gpus for p in pods):
            return True
        return is_aged(job, self.now, self.config.aging)

    def could_host(self, ns: NodeState, pod: PodRequest) -> bool:
        """Could this node hold the pod if it were empty? (cached per node class and shape)"""
        key = (ns.static.class_id, shape_key(pod))
        ok = self._host_cache.get(key)
        if ok is None:
            empty = NodeState(ns.static, foreign=False)  # as _static_fits: other pods end too
            ok = node_filter(empty, pod) is None and bool(
                enumerate_takes(
                    empty, pod, strict_topology=self.placer.scorer.strict_topology, max_takes=1
                )
            )
            self._host_cache[key] = ok
        return ok

    def maybe_reserve(self, job: Job, pods: Sequence[PodRequest]) -> None:
        """Rule (backfill reservation): a capacity-blocked large job holds nodes so that smaller
        jobs behind it cannot delay it. With runtime estimates of the running jobs, it holds the
        nodes of the placement it would get once enough of them end (and jobs that end before that
        time may still use them); without, it holds every node it could use."""
        cfg = self.config
        if not cfg.backfill or len(self.reservations) >= cfg.max_reservations:
            return
        if not self.is_large(job, pods):
            return
        # Rule (one GPU model per job): hold nodes only of model families that could ever hold
        # the job; a job with several GPU pods holds one family only (the first the placer would
        # try), since its pods may not spread over several. A job with one GPU pod waits for one
        # node of any family that could hold it.
        variants: list[tuple[PodRequest, ...]] = [tuple(pods)]
        _, families = one_model_never_fits(job, pods, self.state, lambda v: self._can_hold(job, v))
        if families:
            variants = families
            if sum(1 for p in pods if p.containers) > 1:
                order = one_model_variants(job, pods, self.state, self.placer)
                variants = [next((v for v in order if v in families), families[0])]
        shapes = {shape_key(p): p for v in variants for p in v}
        hosts = frozenset(
            name
            for name, ns in self.state.nodes.items()
            if any(self.could_host(ns, p) for p in shapes.values())
        )
        shadow: float | None = None
        nodes = hosts
        ending = sorted(
            (
                r
                for r in self.running.values()
                if r.expected_end is not None and any(pp.node in hosts for pp in r.pods)
            ),
            key=lambda r: (r.expected_end, r.name),
        )
        if ending:
            held: set[str] = set()
            for res in self.reservations:
                held |= res.nodes
            found: list[Placement] = []

            def fits() -> bool:
                p = self._place(job, pods, frozenset(held))
                if p is None:
                    return False
                for pp in p.pods:
                    self.state.unreserve(pp)
                found.append(p)
                return True

            k = smallest_prefix(self.evictor, ending, fits)
            if k is not None:
                # Find the placement at exactly that prefix for the node set.
                for rj in ending[:k]:
                    self.evictor.remove(rj)
                found.clear()
                if fits():
                    shadow = ending[k - 1].expected_end
                    nodes = frozenset(found[-1].nodes())
                for rj in reversed(ending[:k]):
                    self.evictor.restore(rj)
        self.reservations.append(_Reservation(job.name, nodes, shadow))
        self._reserved_count[job.name] = len(nodes)

    # -- explanations and positions ------------------------------------------------------------

    def capacity_reason(self, job: Job, exclude: frozenset[str]) -> str:
        """Rule (reason, not now): name the first pod that cannot be placed now, what it needs on
        one node, the largest free block of suitable GPUs and on how many nodes; mention nodes held
        for a waiting large job and whether preemption could help."""
        pods = self._pods(job)
        shapes: list[PodRequest] = []
        seen: set[PodRequest] = set()
        for p in pods:
            s = shape_key(p)
            if s not in seen:
                seen.add(s)
                shapes.append(p)
        blocking: PodRequest | None = None
        for p in shapes:
            if self.placer.find(p, exclude=exclude) is None:
                blocking = p
                break
        held = f"; {_nodes(len(exclude))} held for larger jobs waiting ahead" if exclude else ""
        if blocking is None:
            one_model = one_model_variants(job, pods, self.state, self.placer)[0] != tuple(pods)
            return (
                f"Gang of {len(pods)} pods: each pod fits somewhere, but not all of them at "
                f"once{' on GPUs of one model (the job does not allow mixing models)' if one_model else ''}"
                f"{held}"
            )
        prefix = f"Gang of {len(pods)} pods: " if len(pods) > 1 else ""
        return prefix + self._pod_reason(blocking, exclude) + held

    def _pod_reason(self, p: PodRequest, exclude: frozenset[str]) -> str:
        extras = []
        if p.cpu_millicores:
            cores = p.cpu_millicores / 1000
            extras.append(f"{cores:g} CPU core{'' if cores == 1 else 's'}")
        if p.ram_mib:
            extras.append(f"{_mib(p.ram_mib)} RAM")
        cpu_ram = " and ".join(extras)
        if not p.containers:
            return f"Needs {cpu_ram or 'a pod slot'} on one node; no node has that free now"
        need = max(c.gpu_count for c in p.containers)
        c0 = max(p.containers, key=lambda c: c.gpu_count)
        what = "GPU" if c0.whole_cards else "GPU slice"
        ask = describe_gpu_ask(p)
        best = 0
        best_nodes = 0
        short_cpu_ram = 0
        for names in self.state.groups.values():
            ns = self.state.nodes[names[0]]
            count = sum(1 for n in names if n not in exclude) if exclude else len(names)
            if not count:
                continue
            block = 0
            for i, d in self._class_demands(ns, p, c0):
                if ns.gpu_fits(i, d):
                    block += 1
            if block > best:
                best, best_nodes = block, count
            elif block == best:
                best_nodes += count
            if block >= need and node_filter(ns, p) is not None:
                short_cpu_ram += count
        s = "s" if need > 1 else ""
        ask_text = "" if c0.whole_cards and len(p.containers) == 1 else f" ({ask})"
        plus = f" and {cpu_ram}" if cpu_ram else ""
        msg = f"Needs {need} {what}{s}{ask_text}{plus} on one node; "
        if best == 0:
            msg += f"no node has a free {what} of an allowed model now"
        else:
            msg += f"the largest free block is {best} (on {_nodes(best_nodes)})"
        if short_cpu_ram:
            msg += f"; {_nodes(short_cpu_ram)} have the GPUs free but lack CPU, RAM or pod slots"
        if best < need:
            msg += self._foreign_note(p, c0, exclude)
        return msg

    def _foreign_note(self, p: PodRequest, c: GpuRequest, exclude: frozenset[str]) -> str:
        """Rule (reason, foreign pods): when cards that would take the pod are held by pods
        another scheduler placed, say how many. Not which pods: they are outside Camp's
        tenants (their names go to the cluster's admins: the console's node page)."""
        cards = 0
        for names in self.state.groups.values():
            ns = self.state.nodes[names[0]]
            if not any(gs.device.foreign for gs in ns.static.gpus):
                continue
            for name in names:
                if name in exclude:
                    continue
                node = self.state.nodes[name]
                for i, d in self._class_demands(node, p, c):
                    if not node.gpu_fits(i, d) and node.gpu_fits_but_for_foreign(i, d):
                        cards += 1
        if not cards:
            return ""
        if cards == 1:
            return "; 1 GPU that would fit is held by pods Camp did not create (another scheduler's)"
        return f"; {cards} GPUs that would fit are held by pods Camp did not create (another scheduler's)"

    def _class_demands(
        self, ns: NodeState, p: PodRequest, c: GpuRequest
    ) -> list[tuple[int, Demand]]:
        key = (ns.static.class_id, p.gpu_models, p.excluded_gpu_models, c)
        out = self._demand_cache.get(key)
        if out is None:
            out = []
            for i, gs in enumerate(ns.static.gpus):
                if p.allows_model(gs.device.model):
                    d = align_demand(gs.device, c)
                    if d is not None:
                        out.append((i, d))
            self._demand_cache[key] = out
        return out

    def _finish(
        self,
        pending: Sequence[Job],
        provisional: dict[str, tuple[Decision, str, bool, bool]],
        waiting: list[tuple[Job, str, tuple[object, ...] | None]],
    ) -> dict[str, JobStatus]:
        """Rule (position): a waiting job's position is its rank among the jobs still waiting in
        its project queue, in that queue's order (aged, priority, submit time)."""
        waiting_names = {job.name for job, _, _ in waiting}
        pos: dict[str, tuple[int, int]] = {}
        for jobs in self._queue_order(job for job, _, _ in waiting).values():
            queue = [j for j in jobs if j.name in waiting_names]
            n = len(queue)
            for i, j in enumerate(queue):
                pos[j.name] = (i + 1, n)
        reasons: dict[tuple[object, ...], str] = {}
        ctx_of = {job.name: ctx for job, _, ctx in waiting}
        reserved = self._reserved_count
        out: dict[str, JobStatus] = {}
        by_name = {j.name: j for j in pending}
        for name, (d, kind, borrowing, backfilled) in provisional.items():
            job = by_name[name]
            if isinstance(d, Wait):
                p, n = pos[name]
                reason = d.reason
                if kind == Kind.CAPACITY:
                    ctx = ctx_of[name]
                    exclude = ctx[0] if ctx else frozenset()
                    assert isinstance(exclude, frozenset)
                    key = (self._job_shape(job, self._pods(job)), exclude)
                    reason = reasons.get(key) or reasons.setdefault(
                        key, self.capacity_reason(job, exclude)
                    )
                    if name in reserved:
                        reason += _held_for(reserved[name], len(self._pods(job)))
                elif kind == Kind.BEHIND:
                    reason = _behind(p - 1)
                qname = job.queue or "the default queue"
                d = Wait(name, f"{reason} — {ordinal(p)} of {n} in {qname}")
                out[name] = JobStatus(
                    name, job.queue, d, kind, p, n, reserved_nodes=reserved.get(name, 0)
                )
            else:
                out[name] = JobStatus(
                    name, job.queue, d, kind, borrowing=borrowing, backfilled=backfilled
                )
        return out


_MISSING = "\0missing"


def _first(item: tuple[tuple[int, float, float, str], Job]) -> tuple[int, float, float, str]:
    return item[0]


def _over_already(held: int, guaranteed: int) -> str:
    """Why non-preemptible usage can be above a guarantee, said where it is (issue 29: "27.7 of
    8 held" read as impossible)."""
    if held <= guaranteed:
        return ""
    return (", more than the guarantee: admitted before it was lowered, or within a guarantee "
            "across all clusters")


def _borrow_what(r: int) -> str:
    return ("GPUs", "GPU memory", "CPU", "RAM")[r]


def _behind(ahead: int) -> str:
    if ahead == 0:
        # Beyond the heads tried this cycle, though those ahead of it have just started.
        return "Next in its queue; it is tried at the next scheduling cycle"
    return f"Waiting for {ahead} earlier job{'s' if ahead != 1 else ''} in its queue to start first"


def _held_for(nodes: int, pods: int) -> str:
    """Capacity reserved for a waiting large job, in plain words: a one-pod job is told that
    GPUs are being kept for it, not how many candidate nodes the reservation spans."""
    if pods <= 1:
        return "; GPUs are being kept free for it as running jobs end"
    return f"; {_nodes(nodes)} being kept free for it as running jobs end"


def job_shape(job: Job) -> tuple[object, ...]:
    """What decides whether a job can ever run and what it asks: its pod groups' shapes and
    replica counts, gang flag, affinity and whether it may mix GPU models (not its name,
    priority or times)."""
    return (
        tuple((shape_key(g.template), g.replicas) for g in job.groups),
        job.gang,
        job.affinity,
        job.mixed_gpu_models,
    )


def _nodes(n: int) -> str:
    return "1 node" if n == 1 else f"{n} nodes"


def _mib(v: int) -> str:
    return f"{v // 1024} GiB" if v >= 1024 and v % 1024 == 0 else f"{v} MiB"


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------


def run_cycle(
    snapshot: ClusterSnapshot,
    pending: Sequence[Job],
    tree: QueueTree,
    *,
    now: float,
    running: Sequence[RunningJob] | None = None,
    policy: Policy | None = None,
    config: CycleConfig | None = None,
) -> CycleResult:
    """One full cycle on a fresh state built from ``snapshot``.

    ``running`` describes the jobs behind the snapshot's allocations (checkpointing, runtime
    estimates); by default it is derived from the allocations themselves."""
    state = ClusterState(snapshot)
    if policy is None:
        policy = default_policy(profile_for(snapshot, pending))
    placer = Placer(state, policy)
    if running is None:
        running = running_jobs(snapshot)
    return QueueCycle(tree, placer, running, now=now, config=config).run(pending)
