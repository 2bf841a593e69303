"""Queueing on the openb trace: FIFO+BestFit versus Camp (queueing + placement).

``openb_pod_list_default`` is replayed in creation-time order; each pod runs for its trace duration
(deletion − creation) from the moment it starts. On the full openb cluster nothing would ever
queue (the trace never holds more than 66 GPUs at once), so the replay runs on a slice of the
openb cluster: every ``--stride``-th GPU node. Pods are spread round-robin over 8 projects in 2
tenants; each project is guaranteed 1/8 of the slice and limited to 1/2 of it. Priorities follow
the trace's QoS: LS 2, Burstable/Guaranteed 1, BE 0 (only BE is preemptible; an evicted pod is
requeued and restarts).

* fifo — one queue in creation order, strict FIFO (the head blocks the queue), BestFit.
* fifo-skip — the same, but a pod that does not fit is skipped (kube-scheduler style).
* camp — ``QueueCycle``: priority, hierarchical fair share, quotas, borrowing, preemption
  (minimum runtime ``--min-runtime``), non-preemptible jobs only within their guarantees (the
  default), with Camp's fragmentation-aware placement; every pending job is a candidate and no
  backfill reservations are held (the trace has no runtime estimates). A non-preemptible pod asking
  more than its project's guarantee is rejected (counted under "never").
* camp-resubmit — camp, but a pod rejected for asking more than its guarantee is resubmitted at once
  as preemptible (what the rejection tells its user to do).
* camp-np-borrow — camp with ``nonpreemptible_within_guarantee=False``: non-preemptible pods borrow
  idle GPUs like any other (Camp before the rule).
* camp-reserve — Camp with ``--heads`` jobs per project queue and backfill reservations.

Camp's cycles run only when something changed and repeat at the same instant while they admit (see
:func:`replay_camp`). Reported: time-averaged GPU allocation, median and p95 queueing delay
(creation → start, over pods that started), pods never started, preemptions, and project-hours
during which a project with waiting work sat below its guaranteed GPUs (and, separately, while its
first waiting pod would have fitted within them). The p95 delay is also given over the pods that
every scheduler of the run started ("common"), since rejected pods drop out of a scheduler's
delays. Results and the review of this setup are in docs/BENCHMARKS.md §4.

    .venv/bin/python -m bench.queue_replay             # stride 130, all six schedulers (~2 min)
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.openb import DATA, load_nodes, load_pods
from scheduling.engine import (
    BestFitPolicy,
    ClusterSnapshot,
    ClusterState,
    FragmentationPolicy,
    Job,
    Placer,
    PodGroup,
    WorkloadProfile,
)
from scheduling.engine.cycle import CycleConfig, Kind, QueueCycle
from scheduling.engine.fragmentation import shape_key
from scheduling.engine.model import Admit, Preempt, Reject
from scheduling.engine.preemption import PreemptionConfig
from scheduling.engine.queueing import (
    Aging,
    ProjectQueue,
    QueueTree,
    Quota,
    RunningJob,
    TenantQueue,
    placement_usage,
)

RESULTS = Path(__file__).resolve().parent / "results"
PROJECTS = [f"t{t}/p{p}" for t in range(2) for p in range(4)]
PRIORITY = {"LS": 2, "Burstable": 1, "Guaranteed": 1, "BE": 0}


@dataclass
class Sim:
    jobs: dict[str, Job]
    duration: dict[str, float]
    created: dict[str, float]
    qos: dict[str, str]
    capacity: int
    guaranteed_milli: int
    waited: dict[str, float] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    guarantee_waiters: set[str] = field(default_factory=set)
    """Pods that waited at least once because of the non-preemptible-within-guarantee rule."""
    alloc_area: float = 0.0
    below_guarantee: float = 0.0
    series: list[tuple[float, float]] = field(default_factory=list)


def load(stride: int) -> tuple[ClusterSnapshot, Sim]:
    base = load_nodes()
    nodes = tuple(n for i, n in enumerate(base.nodes) if i % stride == 0)
    snap = ClusterSnapshot(nodes=nodes)
    capacity = sum(len(n.gpus) for n in nodes)
    import csv

    rows = list(csv.DictReader((DATA / "openb_pod_list_default.csv").open()))
    pods = load_pods("default")
    jobs: dict[str, Job] = {}
    duration: dict[str, float] = {}
    created: dict[str, float] = {}
    qos: dict[str, str] = {}
    order = sorted(range(len(rows)), key=lambda i: (int(rows[i]["creation_time"]), i))
    for k, i in enumerate(order):
        row, tp = rows[i], pods[i]
        name = row["name"]
        prio = PRIORITY.get(row["qos"], 1)
        c = float(row["creation_time"])
        jobs[name] = Job(
            name=name,
            groups=(PodGroup("p", tp.request, 1),),
            queue=PROJECTS[k % len(PROJECTS)],
            priority=prio,
            preemptible=prio == 0,
            submit_time=c,
        )
        duration[name] = max(1.0, float(row["deletion_time"]) - c)
        created[name] = c
        qos[name] = row["qos"]
    sim = Sim(jobs, duration, created, qos, capacity, capacity * 1000 // len(PROJECTS))
    return snap, sim


def tree_for(sim: Sim) -> QueueTree:
    g = sim.capacity / len(PROJECTS)
    return QueueTree(
        tenants=tuple(
            TenantQueue(
                f"t{t}",
                Quota(gpus_guaranteed=4 * g),
                tuple(
                    ProjectQueue(f"t{t}/p{p}", Quota(gpus_guaranteed=g, gpus_limit=4 * g))
                    for p in range(4)
                ),
            )
            for t in range(2)
        )
    )


class _Metrics:
    """Time-integrated allocation and guarantee checks, shared by both schedulers."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.allocated = 0.0
        self.last_t: float | None = None
        self.below_waiting = 0.0
        self.below_fits = 0.0
        self.n_below_waiting = 0
        self.n_below_fits = 0

    def advance(self, t: float) -> None:
        if self.last_t is not None:
            dt = t - self.last_t
            self.sim.alloc_area += self.allocated * dt
            self.below_waiting += self.n_below_waiting * dt
            self.below_fits += self.n_below_fits * dt
        self.last_t = t

    def guarantee(self, usage: dict[str, float], heads: dict[str, Job]) -> None:
        """Per project with work waiting: is it below its guaranteed GPUs, and would its first
        waiting job fit within them?"""
        g = self.sim.guaranteed_milli / 1000
        self.n_below_waiting = self.n_below_fits = 0
        for q, head in heads.items():
            u = usage.get(q, 0.0)
            if u < g - 1e-9:
                self.n_below_waiting += 1
                if u + _gpus(head) <= g + 1e-9:
                    self.n_below_fits += 1


def _events(sim: Sim) -> list[tuple[float, int, str, str]]:
    events: list[tuple[float, int, str, str]] = []  # (time, kind 0=end 1=arrive 2=timer, job, token)
    for name, c in sim.created.items():
        events.append((c, 1, name, ""))
    heapq.heapify(events)
    return events


def _result(
    sim: Sim, scheduler: str, m: _Metrics, never: set[str], cycles: int, wall: float
) -> dict[str, object]:
    delays = sorted(sim.waited.values())
    span = (m.last_t or 0.0) - min(sim.created.values())
    by_qos: dict[str, list[float]] = {}
    by_tenant: dict[str, list[float]] = {}
    for n, w in sim.waited.items():
        by_qos.setdefault(sim.qos[n], []).append(w)
        by_tenant.setdefault(sim.jobs[n].queue.split("/")[0], []).append(w)
    return {
        "scheduler": scheduler,
        "pods": len(sim.jobs),
        "started": len(sim.started),
        "never_fit": len(never),
        "avg_gpu_alloc_pct": 100 * sim.alloc_area / (span * sim.capacity),
        "median_delay_s": statistics.median(delays),
        "p95_delay_s": _pct(delays, 0.95),
        "mean_delay_s": statistics.fmean(delays),
        "p95_delay_by_qos_s": {q: _pct(sorted(v), 0.95) for q, v in sorted(by_qos.items())},
        "delay_by_tenant_s": {t: {"p50": _pct(sorted(v), 0.5), "p95": _pct(sorted(v), 0.95)}
                              for t, v in sorted(by_tenant.items())},
        "preemptions": sim.preemptions,
        "below_guarantee_waiting_project_hours": m.below_waiting / 3600,
        "below_guarantee_project_hours": m.below_fits / 3600,
        "guarantee_waiters": len(sim.guarantee_waiters),
        "guarantee_waiters_p95_delay_s": _pct(sorted(w for n, w in sim.waited.items()
                                                     if n in sim.guarantee_waiters), 0.95),
        "p95_delay_others_s": _pct(sorted(w for n, w in sim.waited.items()
                                          if n not in sim.guarantee_waiters), 0.95),
        "cycles": cycles,
        "wall_s": wall,
        "_waited": dict(sim.waited),
    }


def _pct(xs: list[float], q: float) -> float:
    return xs[int(q * (len(xs) - 1))] if xs else 0.0


def replay_fifo(snap: ClusterSnapshot, sim: Sim, *, strict: bool = True) -> dict[str, object]:
    """FIFO+BestFit: pending pods in creation order. ``strict``: the first pod that does not fit
    blocks the queue; otherwise (kube-scheduler style) it is skipped and the next one is tried."""
    state = ClusterState(snap)
    placer = Placer(state, BestFitPolicy())
    card = {n.name: [g.memory_mib for g in n.gpus] for n in snap.nodes}
    events = _events(sim)
    pending: dict[str, Job] = {}
    pending_since: dict[str, float] = {}
    running: dict[str, tuple[RunningJob, float]] = {}
    token: dict[str, str] = {}
    never: set[str] = set()
    m = _Metrics(sim)
    cycles = 0
    t0 = time.perf_counter()
    while events:
        t = events[0][0]
        m.advance(t)
        while events and events[0][0] == t:
            _, kind, name, tok = heapq.heappop(events)
            if kind == 1:
                pending[name] = sim.jobs[name]
                pending_since[name] = t
            elif token.get(name) == tok and name in running:
                rj, g = running.pop(name)
                for pp in rj.pods:
                    state.unreserve(pp)
                m.allocated -= g
        cycles += 1
        failed: dict[object, int] = {}
        for name in list(pending):  # creation order (requeues never happen in FIFO)
            job = pending[name]
            shape = shape_key(job.groups[0].template)
            if failed.get(shape) == state.version:
                continue
            d = placer.place_job(job)
            if isinstance(d, Admit):
                del pending[name]
                sim.waited[name] = t - pending_since.pop(name)
                sim.started.setdefault(name, t)
                rj = RunningJob(name, d.placement.pods, job.queue, job.priority, job.preemptible, False, t)
                g = placement_usage(rj.pods, card)[0] / 1000
                running[name] = (rj, g)
                m.allocated += g
                tok = f"{name}@{t}"
                token[name] = tok
                heapq.heappush(events, (t + sim.duration[name], 0, name, tok))
            elif isinstance(d, Reject):
                never.add(name)
                del pending[name]
            elif strict:
                break
            else:
                failed[shape] = state.version
        usage: dict[str, float] = {}
        for rj, g in running.values():
            usage[rj.queue] = usage.get(rj.queue, 0.0) + g
        heads: dict[str, Job] = {}
        for job in pending.values():
            heads.setdefault(job.queue, job)
        m.guarantee(usage, heads)
    return _result(sim, "fifo" if strict else "fifo-skip", m, never, cycles, time.perf_counter() - t0)


class _ProjectQueue:
    """One project's pending jobs in Camp's queue order (aged by submit time, then priority, then
    submit time), so that a cycle is handed only the heads of each queue."""

    def __init__(self) -> None:
        self.by_submit: list[tuple[float, str]] = []
        self.by_prio: list[tuple[int, float, str]] = []

    def add(self, job: Job) -> None:
        bisect.insort(self.by_submit, (job.submit_time, job.name))
        bisect.insort(self.by_prio, (-job.priority, job.submit_time, job.name))

    def remove(self, job: Job) -> None:
        for lst, key in (
            (self.by_submit, (job.submit_time, job.name)),
            (self.by_prio, (-job.priority, job.submit_time, job.name)),
        ):
            i = bisect.bisect_left(lst, key)  # type: ignore[call-overload]
            del lst[i]

    def heads(self, k: int, now: float, max_wait: float) -> list[str]:
        out: list[str] = []
        for submit, name in self.by_submit:
            if now - submit < max_wait or len(out) >= k:
                break
            out.append(name)
        aged = set(out)
        for _, _, name in self.by_prio:
            if len(out) >= k:
                break
            if name not in aged:
                out.append(name)
        return out


def replay_camp(
    snap: ClusterSnapshot,
    sim: Sim,
    min_runtime: float,
    heads: int,
    *,
    backfill: bool = True,
    np_within_guarantee: bool = True,
    resubmit_preemptible: bool = False,
) -> dict[str, object]:
    """Camp: ``QueueCycle`` with fair share, quotas, borrowing, preemption and backfill.

    A cycle runs only when something changed — an arrival among the heads of its queue, a
    departure, a pending job reaching the aging threshold, a running job reaching the minimum
    runtime (it becomes preemptible) — and again at the same instant while the previous cycle
    admitted or preempted something (the heads of the queues changed), as the service does. The
    cluster state and the placer (with its score caches) live across cycles; each cycle is handed
    the first ``heads`` jobs of every project queue. ``np_within_guarantee`` is the cycle's
    non-preemptible-within-guarantee rule; with ``resubmit_preemptible`` a non-preemptible pod
    rejected for asking more than its guarantee is resubmitted at once as preemptible."""
    profile = WorkloadProfile.from_pods([j.groups[0].template for j in sim.jobs.values()])
    state = ClusterState(snap)
    placer = Placer(state, FragmentationPolicy(profile))
    card = {n.name: [g.memory_mib for g in n.gpus] for n in snap.nodes}
    tree = tree_for(sim)
    max_wait = 6 * 3600.0
    config = CycleConfig(
        aging=Aging(max_wait_s=max_wait),
        preemption=PreemptionConfig(min_runtime_s=min_runtime),
        heads_per_queue=None,  # the replay hands each cycle the heads of the queues itself
        backfill=backfill,
        nonpreemptible_within_guarantee=np_within_guarantee,
    )
    events = _events(sim)
    queues = {q: _ProjectQueue() for q in PROJECTS}
    pending: dict[str, Job] = {}
    pending_since: dict[str, float] = {}
    running: dict[str, RunningJob] = {}
    gpus_of: dict[str, float] = {}
    token: dict[str, str] = {}
    never: set[str] = set()
    m = _Metrics(sim)
    cycles = 0
    t0 = time.perf_counter()

    def enqueue(name: str, t: float) -> None:
        job = sim.jobs[name]
        pending[name] = job
        pending_since[name] = t
        queues[job.queue].add(job)
        if job.submit_time + max_wait > t:
            heapq.heappush(events, (job.submit_time + max_wait, 2, name, "aged"))

    while events:
        t = events[0][0]
        m.advance(t)
        dirty = False
        while events and events[0][0] == t:
            _, kind, name, tok = heapq.heappop(events)
            if kind == 1:
                enqueue(name, t)
                q = queues[sim.jobs[name].queue]
                dirty = dirty or name in q.heads(heads, t, max_wait)
            elif kind == 0:
                if token.get(name) == tok and name in running:
                    for pp in running.pop(name).pods:
                        state.unreserve(pp)
                    m.allocated -= gpus_of.pop(name)
                    dirty = True
            elif tok == "aged":
                dirty = dirty or name in pending
            else:  # minimum runtime reached: the job may now be a victim
                dirty = dirty or (token.get(name) == tok and name in running)
        rounds = 0
        while dirty and rounds < 1000:
            rounds += 1
            cycles += 1
            batch = [pending[n] for q in queues.values() for n in q.heads(heads, t, max_wait)]
            if not batch:
                break
            cyc = QueueCycle(tree, placer, list(running.values()), now=t, config=config)
            res = cyc.run(batch)
            dirty = False
            for d in res.decisions:
                if isinstance(d, Preempt):
                    for v in d.victims:
                        sim.preemptions += 1
                        running.pop(v)
                        m.allocated -= gpus_of.pop(v)
                        token[v] = ""
                        enqueue(v, t)
                if isinstance(d, Admit | Preempt):
                    dirty = True
                    job = pending.pop(d.job)
                    queues[job.queue].remove(job)
                    sim.waited[d.job] = sim.waited.get(d.job, 0.0) + (t - pending_since.pop(d.job))
                    sim.started.setdefault(d.job, t)
                    rj = RunningJob(d.job, d.placement.pods, job.queue, job.priority, job.preemptible,
                                    False, t, None)
                    running[d.job] = rj
                    g = placement_usage(rj.pods, card)[0] / 1000
                    gpus_of[d.job] = g
                    m.allocated += g
                    tok = f"{d.job}@{t}"
                    token[d.job] = tok
                    heapq.heappush(events, (t + sim.duration[d.job], 0, d.job, tok))
                    if job.preemptible and min_runtime > 0:
                        heapq.heappush(events, (t + min_runtime, 3, d.job, tok))
            for s in res.statuses.values():
                if s.kind == Kind.GUARANTEE:
                    sim.guarantee_waiters.add(s.job)
                if s.kind == Kind.OVER_GUARANTEE and resubmit_preemptible and s.job in pending:
                    job = replace(pending[s.job], preemptible=True)
                    pending[s.job] = sim.jobs[s.job] = job
                    dirty = True
                    continue
                never_kinds = (Kind.NEVER_FITS, Kind.OVER_LIMIT, Kind.UNKNOWN_QUEUE, Kind.OVER_GUARANTEE)
                if s.kind in never_kinds and s.job in pending:
                    never.add(s.job)
                    job = pending.pop(s.job)
                    pending_since.pop(s.job)
                    queues[job.queue].remove(job)
                    dirty = True
        usage: dict[str, float] = {}
        for name, rj in running.items():
            usage[rj.queue] = usage.get(rj.queue, 0.0) + gpus_of[name]
        waiting_heads: dict[str, Job] = {}
        for qn, q in queues.items():
            h = q.heads(1, t, max_wait)
            if h:
                waiting_heads[qn] = pending[h[0]]
        m.guarantee(usage, waiting_heads)
    return _result(sim, "camp", m, never, cycles, time.perf_counter() - t0)


def replay_kueue(snap: ClusterSnapshot, sim: Sim) -> dict[str, object]:
    """Kueue's admission rules, reimplemented from its documentation (concepts: ClusterQueue,
    Cohort, Preemption; the scheduler's BestEffortFIFO), as a baseline (issue 34):

    * each project is a ClusterQueue with ``nominalQuota`` = its guarantee and a
      ``borrowingLimit`` up to its limit, all eight in one cohort (Kueue's cohorts are flat);
      quota is counted in GPU shares (a HAMi pod's ``gpucores``/100, a whole card 1), as a
      ClusterQueue quota on HAMi's resources would, which favours Kueue over counting
      ``nvidia.com/gpu`` (1 per shared pod);
    * ``queueingStrategy: BestEffortFIFO``: a queue's workloads by priority, then the time
      they were queued (creation, or eviction: ``requeuingStrategy.timestamp: Eviction``); a
      head that does not fit is set aside and the next one tried, until something changes;
    * each round takes every queue's head, those that would not borrow first, then by priority
      and time, and admits what fits its queue's limit and the cohort's quota (the queues'
      nominal quotas, lent to each other while unused);
    * preemption ``withinClusterQueue: LowerPriority`` and ``reclaimWithinCohort: Any``: the
      candidates are the queue's own lower-priority workloads and, if the incoming workload
      then fits within its nominal quota, any workload of a borrowing queue of the cohort;
      taken borrowing queues first, then lowest priority, then most recently admitted, until
      it fits, then given back in reverse where it still fits (a minimal set);
    * admission is quota only: the admitted workload's pod is then placed by kube-scheduler
      (BestFit, as fifo-skip), and waits, holding its quota, while no node has room for it
      (``waitForPodsReady`` off, the default).

    Priorities follow the trace's QoS as for Camp; Kueue has no notion of a non-preemptible
    workload beyond priority, so Burstable pods may be preempted by LS ones of their queue."""
    state = ClusterState(snap)
    placer = Placer(state, BestFitPolicy())
    card = {n.name: [g.memory_mib for g in n.gpus] for n in snap.nodes}
    nominal = sim.guaranteed_milli / 1000
    limit = 4 * nominal
    capacity = nominal * len(PROJECTS)
    events = _events(sim)
    pending: dict[str, Job] = {}
    queued_at: dict[str, float] = {}
    pending_since: dict[str, float] = {}
    admitted: dict[str, tuple[str, float, float]] = {}  # name -> (queue, share, admitted at)
    placing: list[str] = []  # admitted, waiting for kube-scheduler, in admission order
    running: dict[str, RunningJob] = {}
    gpus_of: dict[str, float] = {}
    token: dict[str, str] = {}
    never: set[str] = set()
    usage = dict.fromkeys(PROJECTS, 0.0)
    m = _Metrics(sim)
    cycles = 0
    t0 = time.perf_counter()
    eps = 1e-9

    def fits(q: str, need: float, use: dict[str, float]) -> bool:
        # within the queue's limit (nominal + borrowingLimit), and the cohort's quota (the sum of
        # its queues' nominal quotas) has room: a queue's unused nominal quota is lent to the
        # cohort, so while others borrow it the queue gets it back only by reclaiming
        return use[q] + need <= limit + eps and sum(use.values()) + need <= capacity + eps

    def evict(name: str, t: float) -> None:
        q, share, _ = admitted.pop(name)
        usage[q] -= share
        sim.preemptions += 1
        if name in running:
            for pp in running.pop(name).pods:
                state.unreserve(pp)
            m.allocated -= gpus_of.pop(name)
        else:
            placing.remove(name)
        token[name] = ""
        pending[name] = sim.jobs[name]
        queued_at[name] = t
        pending_since[name] = t

    def preempt_for(job: Job, need: float) -> list[str] | None:
        q = job.queue
        within = usage[q] + need <= nominal + eps
        cands = [n for n, (cq, _, _) in admitted.items()
                 if (cq == q and sim.jobs[n].priority < job.priority)
                 or (within and cq != q and usage[cq] > nominal + eps)]
        cands.sort(key=lambda n: (admitted[n][0] == q, sim.jobs[n].priority, -admitted[n][2]))
        use = dict(usage)
        taken: list[str] = []
        for n in cands:
            if fits(q, need, use):
                break
            cq, share, _ = admitted[n]
            if cq != q and use[cq] <= nominal + eps:
                continue  # that queue no longer borrows: not reclaimable
            use[cq] -= share
            taken.append(n)
        if not fits(q, need, use):
            return None
        for n in reversed(list(taken)):
            cq, share, _ = admitted[n]
            use[cq] += share
            if fits(q, need, use):
                taken.remove(n)
            else:
                use[cq] -= share
        return taken

    while events:
        t = events[0][0]
        m.advance(t)
        while events and events[0][0] == t:
            _, kind, name, tok = heapq.heappop(events)
            if kind == 1:
                pending[name] = sim.jobs[name]
                queued_at[name] = pending_since[name] = t
            elif token.get(name) == tok and name in running:
                for pp in running.pop(name).pods:
                    state.unreserve(pp)
                m.allocated -= gpus_of.pop(name)
                q, share, _ = admitted.pop(name)
                usage[q] -= share
        aside: set[str] = set()  # inadmissible until something changes (BestEffortFIFO)
        while True:
            cycles += 1
            by_queue: dict[str, list[Job]] = {}
            for job in pending.values():
                if job.name not in aside:
                    by_queue.setdefault(job.queue, []).append(job)
            heads = [min(js, key=lambda j: (-j.priority, queued_at[j.name], j.name))
                     for js in by_queue.values()]
            if not heads:
                break
            heads.sort(key=lambda j: (usage[j.queue] + _gpus(j) > nominal + eps, -j.priority,
                                      queued_at[j.name], j.name))
            changed = False
            for job in heads:
                need = _gpus(job)
                if need > limit + eps:
                    never.add(job.name)
                    del pending[job.name]
                    continue
                if not fits(job.queue, need, usage):
                    victims = preempt_for(job, need)
                    if not victims:
                        aside.add(job.name)
                        continue
                    for v in victims:
                        evict(v, t)
                    aside.clear()
                if not fits(job.queue, need, usage):
                    aside.add(job.name)
                    continue
                del pending[job.name]
                admitted[job.name] = (job.queue, need, t)
                usage[job.queue] += need
                placing.append(job.name)
                changed = True
            if not changed:
                break
        # kube-scheduler: the admitted pods, in admission order, where they fit (BestFit)
        for name in list(placing):
            job = sim.jobs[name]
            d = placer.place_job(job)
            if not isinstance(d, Admit):
                continue
            placing.remove(name)
            sim.waited[name] = sim.waited.get(name, 0.0) + (t - pending_since.pop(name))
            sim.started.setdefault(name, t)
            rj = RunningJob(name, d.placement.pods, job.queue, job.priority, job.preemptible, False, t)
            running[name] = rj
            g = placement_usage(rj.pods, card)[0] / 1000
            gpus_of[name] = g
            m.allocated += g
            tok = f"{name}@{t}"
            token[name] = tok
            heapq.heappush(events, (t + sim.duration[name], 0, name, tok))
        held: dict[str, float] = {}
        for name, rj in running.items():
            held[rj.queue] = held.get(rj.queue, 0.0) + gpus_of[name]
        waiting_heads: dict[str, Job] = {}
        for job in sorted(pending.values(), key=lambda j: (-j.priority, queued_at[j.name], j.name)):
            waiting_heads.setdefault(job.queue, job)
        m.guarantee(held, waiting_heads)
    return _result(sim, "kueue", m, never, cycles, time.perf_counter() - t0)


def _gpus(job: Job) -> float:
    c = job.groups[0].template.containers
    if not c:
        return 0.0
    r = c[0]
    return r.gpu_count * (1.0 if r.whole_cards else r.gpu_cores_percent / 100)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=130)
    ap.add_argument("--min-runtime", type=float, default=600.0)
    ap.add_argument("--schedulers", nargs="+",
                    default=["fifo", "fifo-skip", "kueue", "camp", "camp-resubmit", "camp-np-borrow",
                             "camp-reserve"],
                    help="fifo (strict), fifo-skip, kueue (Kueue's admission rules, then BestFit), camp (all "
                    "heads, no reservations), camp-resubmit "
                    "(over-guarantee pods resubmitted preemptible), camp-np-borrow (non-preemptible "
                    "pods may borrow), camp-reserve (--heads per queue, backfill reservations)")
    ap.add_argument("--heads", type=int, default=4, help="camp-reserve: jobs tried per queue and cycle")
    args = ap.parse_args()
    rows = []
    gpus = 0
    nodes = 0
    for s in args.schedulers:
        snap, sim = load(args.stride)
        gpus, nodes = sim.capacity, len(snap.nodes)
        if s == "camp":
            row = replay_camp(snap, sim, args.min_runtime, len(sim.jobs), backfill=False)
        elif s in ("camp-resubmit", "camp-np-borrow"):
            row = replay_camp(snap, sim, args.min_runtime, len(sim.jobs), backfill=False,
                              np_within_guarantee=s == "camp-resubmit",
                              resubmit_preemptible=s == "camp-resubmit")
            row["scheduler"] = s
        elif s == "camp-reserve":
            row = replay_camp(snap, sim, args.min_runtime, args.heads, backfill=True)
            row["scheduler"] = s
        elif s == "kueue":
            row = replay_kueue(snap, sim)
        else:
            row = replay_fifo(snap, sim, strict=s == "fifo")
        rows.append(row)
        print(f"{s}: {row['wall_s']:.1f} s", flush=True)
    common = set.intersection(*(set(r["_waited"]) for r in rows))  # type: ignore[call-overload]
    for r in rows:
        waited = r.pop("_waited")
        assert isinstance(waited, dict)
        r["common_pods"] = len(common)
        r["p95_delay_common_s"] = _pct(sorted(waited[n] for n in common), 0.95)
        r["median_delay_common_s"] = _pct(sorted(waited[n] for n in common), 0.5)
    print(f"openb default, {nodes} nodes / {gpus} GPUs (every {args.stride}th openb node)")
    hdr = (f"{'scheduler':<14} {'started':>8} {'never':>6} {'GPU alloc %':>11} {'median s':>9} "
           f"{'p95 s':>9} {'preempt':>8} {'below-g. waiting h':>18} {'below-g. fits h':>15} {'wall s':>7}")
    print(hdr)
    for r in rows:
        print(f"{r['scheduler']:<14} {r['started']:>8} {r['never_fit']:>6} {r['avg_gpu_alloc_pct']:>11.1f} "
              f"{r['median_delay_s']:>9.0f} {r['p95_delay_s']:>9.0f} {r['preemptions']:>8} "
              f"{r['below_guarantee_waiting_project_hours']:>18.1f} "
              f"{r['below_guarantee_project_hours']:>15.1f} "
              f"{r['wall_s']:>7.1f}")
        print(f"{'':<14} delay by tenant: {r['delay_by_tenant_s']}")
        print(f"{'':<14} p95 by QoS: {r['p95_delay_by_qos_s']}; over the {r['common_pods']} pods "
              f"every scheduler started: median {r['median_delay_common_s']:.0f}, "
              f"p95 {r['p95_delay_common_s']:.0f}")
        if r["guarantee_waiters"]:
            print(f"{'':<14} {r['guarantee_waiters']} pods waited for their guarantee (p95 "
                  f"{r['guarantee_waiters_p95_delay_s']:.0f} s); p95 of the others "
                  f"{r['p95_delay_others_s']:.0f} s")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "queue_replay.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
