"""One pool across clusters (issue 16): "any cluster" placement versus random pinning.

The openb ``default`` trace (Alibaba cluster-trace-gpu-v2023) is replayed, as in
``bench/queue_replay.py`` (creation order, each pod runs its trace duration once started, 8
projects in 2 tenants, QoS → priority, BE preemptible), on the openb cluster or a slice of it
(every ``--stride``-th GPU node; 1: all 1,213 nodes, 6,212 GPUs) split into two clusters of
half the nodes each (``split``): ``--split alternate`` (default) deals them alternately by size
so that each has about half of the GPUs and nearly the same mix; ``--split model`` sorts them by
(model, GPUs per node, name) and gives the first half to a, the rest to b (whole cluster: a
606 nodes, 4,735 GPUs, A10/G2/G3 and 16 P100 nodes; b 607 nodes, 1,477 GPUs, P100/T4/V100).
Each cluster runs Camp's own queue cycle (``QueueCycle``:
priority, fair share, quotas scaled to its size, preemption, fragmentation-aware placement) on
``--heads`` jobs per project queue (0: all; 8: the service's default, raised to each queue's
share of the free GPUs, counted in jobs, as ``SCHEDULER_HEADS_FILL`` did before issue 35), re-run
while it admits.

* pinned — every job is pinned at submit to a random cluster among those that could ever run
  it (a pod asking for a GPU model only one cluster has goes there); ``--pin uniform``
  (default) draws each eligible cluster alike, ``--pin weighted`` in proportion to its GPUs.
* any — every job floats: the placement step takes the ``--window`` oldest floating jobs still
  queued (by default the service's ``PLACEMENT_BATCH``, imported: 500), bound or not, in ``global_order``, and
  binds them with the product's own loop, ``multicluster.step`` (the function
  ``services.placement.placement_run`` calls): ``choose`` = fits now > fits after preemption >
  shortest estimated wait, tentative reservations so later jobs see what is left, and a bound
  job still queued moves only when another cluster would start it strictly sooner. Only the
  trials (each cluster's placer, running jobs, GPU usage and limits) and the bind (moving the
  job between in-memory queues instead of the conditional UPDATE) are the bench's. A job a
  cluster's cycle can never run goes back to the global queue with that cluster refused, as
  ``cycle._apply`` does. Jobs declare their duration (the trace's), which the wait estimate
  uses, as users' ``duration_seconds`` would. ``--batches n``: as ``placement_run``, a step
  goes on with the next ``--window`` jobs behind (same trials, each batch in global order)
  while its last batch was full, at most n batches; the service stops once
  ``PLACEMENT_BUDGET_S`` (2 s) of wall time is spent, which has no equivalent in simulated
  time, so n stands for it (``--budget s`` also stops once the step's measured engine time,
  ``M.step`` alone, reaches s). The engine time of every batch is reported.

``--load k`` compresses the arrivals: each pod arrives at first + (creation − first) / k and
still runs its trace duration, so the offered load is k times the trace's (on the whole
cluster: 1.86e8 GPU-seconds over 6,212 GPUs and 149 days is 0.23 % at k = 1). ``--tick s``
models the service's cadence (cycle and placement requests coalesce; a tick every
``SCHEDULER_TICK_SECONDS``): events are handled up to the next multiple of ``s``, then one
placement step (any) and a cycle of each cluster where something changed run at that tick
(0: at each event time). Both modes get the same cadence, heads and quotas.

Reported per mode (medians over ``--runs`` seeds for pinned, ``--any-runs`` for any): p50, p95
and mean queueing delay (creation → first start) over the pods that started, time-averaged
GPU allocation of both clusters (first arrival → last event), pods never started,
preemptions, wall time; pods that waited longer than a tick, the peak queue, and the free
GPU-seconds of a cluster while jobs waited elsewhere (at most what pooling could use).
``MB_DEBUG=1`` prints the queues at each tick; ``MB_PROFILE=start:seconds[:file]`` profiles
``seconds`` of wall time from ``start`` s of simulated time.

    .venv/bin/python -m bench.multicluster              # stride 130, per event, all heads (~6 min)
    .venv/bin/python -m bench.multicluster --stride 1 --load 300 --heads 8 --tick 3 \
        --out multicluster_k300.json                    # the whole cluster, 300x arrivals
    .venv/bin/python -m bench.multicluster --stride 1 --load 2000 --copies 2 --heads 8 --tick 3 \
        --modes any --batches 3 --out multicluster_k2000_m2_any_b3.json   # every pod twice
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import json
import math
import os
import pstats
import random
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.queue_replay import PROJECTS, Sim, load
from scheduling.engine import ClusterSnapshot, ClusterState, FragmentationPolicy, Job, Placer, WorkloadProfile
from scheduling.engine import multicluster as M
from scheduling.engine.cycle import CycleConfig, Kind, QueueCycle
from scheduling.engine.model import Admit, Node, Preempt
from scheduling.engine.placement import model_family
from scheduling.engine.preemption import PreemptionConfig
from scheduling.engine.queueing import (
    ProjectQueue,
    QueueTree,
    Quota,
    RunningJob,
    TenantQueue,
    placement_usage,
)

# As bench/queue_replay.py's camp: what can never start as asked is counted under "never".
NEVER_KINDS = (Kind.NEVER_FITS, Kind.OVER_LIMIT, Kind.UNKNOWN_QUEUE, Kind.OVER_GUARANTEE)
RESULTS = Path(__file__).resolve().parent / "results"


def tree(capacity: int) -> QueueTree:
    """Per cluster: each project guaranteed 1/8 of the cluster's GPUs, limited to 1/2 of them."""
    g = capacity / len(PROJECTS)
    return QueueTree(tenants=tuple(
        TenantQueue(f"t{t}", Quota(gpus_guaranteed=4 * g),
                    tuple(ProjectQueue(f"t{t}/p{p}", Quota(gpus_guaranteed=g, gpus_limit=4 * g))
                          for p in range(4)))
        for t in range(2)))


@dataclass
class ClusterSim:
    name: str
    snap: ClusterSnapshot
    placer: Placer
    tree: QueueTree
    capacity: int
    pending: dict[str, Job] = field(default_factory=dict)
    running: dict[str, RunningJob] = field(default_factory=dict)
    gpus_of: dict[str, float] = field(default_factory=dict)

    def free(self) -> float:
        """Free GPUs (the held ones counted as ``placement_usage`` does: the larger of compute
        and memory share); what ``free_gpus`` would find, without walking every card."""
        return max(0.0, self.capacity - sum(self.gpus_of.values()))

    def heads(self, k: int) -> list[Job]:
        """The first ``k`` jobs of each project queue (0: all); at least each queue's share of
        the free GPUs counted in jobs, as the service's heads rule was before issue 35 (kept so
        §9's figures stay comparable; the service now counts what jobs ask: CycleConfig.heads_fill)."""
        if k <= 0:
            return list(self.pending.values())
        by_q: dict[str, list[Job]] = defaultdict(list)
        for j in self.pending.values():
            by_q[j.queue].append(j)
        if by_q:
            k = max(k, math.ceil(self.free() / len(by_q)))
        out: list[Job] = []
        for js in by_q.values():
            js.sort(key=lambda j: (-j.priority, j.submit_time, j.name))
            out.extend(js[:k])
        return out


def split(snap: ClusterSnapshot, how: str = "alternate") -> tuple[ClusterSnapshot, ClusterSnapshot]:
    """Half the nodes each. ``alternate``: dealt alternately in the order (GPUs per node, model,
    name), so the two have about half of the GPUs each and nearly the same mix (at stride 130: a
    gets the G3 node, b the P100 one; 28 and 22 GPUs). ``model``: sorted by (model, GPUs per
    node, name), the first half of the nodes to a and the rest to b, so the mixes really differ
    (whole cluster: a the A10/G2/G3 estate and a few P100 nodes, b the other P100, T4 and V100
    nodes) and so does the GPU capacity."""
    def model(n: Node) -> str:
        return n.gpus[0].model if n.gpus else ""

    if how == "model":
        nodes = sorted(snap.nodes, key=lambda n: (model(n), len(n.gpus), n.name))
        half = len(nodes) // 2
        return ClusterSnapshot(nodes=tuple(nodes[:half])), ClusterSnapshot(nodes=tuple(nodes[half:]))
    if how != "alternate":
        raise ValueError(f"split: unknown split {how!r} (alternate, model)")
    nodes = sorted(snap.nodes, key=lambda n: (-len(n.gpus), model(n), n.name))
    return ClusterSnapshot(nodes=tuple(nodes[0::2])), ClusterSnapshot(nodes=tuple(nodes[1::2]))


def could_run(job: Job, c: ClusterSim) -> bool:
    return not any(c.placer.never_fits(p) for p in job.pods())


def compress(sim: Sim, k: float, copies: int = 1) -> None:
    """Arrivals k times denser (creation − first arrival, divided by k); durations unchanged.
    ``copies`` > 1: every pod is submitted that many times at the same instant, copy i in the
    project i places after the original's (the same pods, order and durations, m times over)."""
    first = min(sim.created.values())
    for name, c in list(sim.created.items()):
        sim.created[name] = first + (c - first) / k
        job = sim.jobs[name] = replace(sim.jobs[name], submit_time=sim.created[name])
        for i in range(1, copies):
            twin = f"{name}#{i}"
            q = PROJECTS[(PROJECTS.index(job.queue) + i) % len(PROJECTS)]
            sim.jobs[twin] = replace(job, name=twin, queue=q)
            sim.created[twin], sim.duration[twin] = sim.created[name], sim.duration[name]
            sim.qos[twin] = sim.qos[name]


def replay(mode: str, stride: int, seed: int, heads: int, window: int, min_runtime: float,
           load_factor: float = 1.0, tick: float = 0.0, copies: int = 1, batches: int = 1,
           budget: float = 0.0, how: str = "alternate", pin: str = "uniform") -> dict[str, object]:
    snap, sim = load(stride)
    compress(sim, load_factor, copies)
    profile = WorkloadProfile.from_pods([j.groups[0].template for j in sim.jobs.values()])
    clusters = []
    for name, part in zip(("a", "b"), split(snap, how), strict=True):
        cap = sum(len(n.gpus) for n in part.nodes)
        clusters.append(ClusterSim(name, part, Placer(ClusterState(part), FragmentationPolicy(profile)),
                                   tree(cap), cap))
    by_name = {c.name: c for c in clusters}
    views = {c.name: M.ClusterView(c.name, gpu_models=frozenset(model_family(g.model) for n in c.snap.nodes
                                                                 for g in n.gpus),
                                   gpu_capacity=float(c.capacity)) for c in clusters}
    rng = random.Random(seed)
    config = CycleConfig(preemption=PreemptionConfig(min_runtime_s=min_runtime), heads_per_queue=None,
                         backfill=False)
    card = {n.name: [g.memory_mib for g in n.gpus] for c in clusters for n in c.snap.nodes}
    events: list[tuple[float, int, str, str]] = [(c, 1, n, "") for n, c in sim.created.items()]
    heapq.heapify(events)
    floating: dict[str, Job] = {}  # any: not bound yet
    changed = [False]  # capacity freed since the last placement step
    bound: dict[str, str] = {}  # any: job → cluster while queued there
    token: dict[str, str] = {}
    where: dict[str, str] = {}
    never: set[str] = set()
    refused: dict[str, dict[str, str]] = {}  # any: job → clusters whose cycle found it can never run there
    waited: dict[str, float] = {}
    allocated, area, last_t, preemptions = 0.0, 0.0, None, 0
    arrivals_end = max(sim.created.values())
    area_w = 0.0  # GPU-seconds held between the first and the last arrival
    # Free GPUs on a cluster while jobs wait elsewhere (pinned: queued on the other cluster; any:
    # bound there or still floating), after each tick's cycles, held until the next tick: the
    # most that pooling the two clusters could have used (an upper bound: free GPUs may be
    # scattered slices the waiting jobs cannot use).
    beside, beside_at, idle_beside = 0.0, 0.0, 0.0
    queued_peak: tuple[int, list[int], float] = (0, [], 0.0)  # (jobs waiting, per cluster, at t)
    t0 = time.perf_counter()
    first = min(sim.created.values())

    dirty: set[str] = set()
    # MB_PROFILE="start:seconds[:file]": cProfile the replay from ``start`` s of simulated time
    # (since the first arrival) for ``seconds`` of wall time, then print the top and go on.
    prof_spec = os.environ.get("MB_PROFILE", "").split(":")
    prof: cProfile.Profile | None = None
    prof_until = math.inf

    def start_cycle(c: ClusterSim, t: float) -> None:
        nonlocal allocated, preemptions
        for _ in range(50):
            batch = c.heads(heads)
            if not batch:
                return
            res = QueueCycle(c.tree, c.placer, list(c.running.values()), now=t, config=config).run(batch)
            progressed = False
            for d in res.decisions:
                if isinstance(d, Preempt):
                    for v in d.victims:
                        preemptions += 1
                        c.running.pop(v)  # the cycle unreserved its pods
                        allocated -= c.gpus_of.pop(v)
                        token[v] = ""
                        requeue(v, c, t)
                        changed[0] = True
                if isinstance(d, Admit | Preempt):
                    progressed = True
                    job = c.pending.pop(d.job)
                    bound.pop(d.job, None)
                    waited.setdefault(d.job, t - sim.created[d.job])
                    rj = RunningJob(d.job, d.placement.pods, job.queue, job.priority, job.preemptible,
                                    False, t, sim.duration[d.job])
                    c.running[d.job] = rj
                    g = placement_usage(rj.pods, card)[0] / 1000
                    c.gpus_of[d.job] = g
                    allocated += g
                    tok = f"{d.job}@{t}"
                    token[d.job] = tok
                    where[d.job] = c.name
                    heapq.heappush(events, (t + sim.duration[d.job], 0, d.job, tok))
            for s in res.statuses.values():
                if s.kind in NEVER_KINDS and s.job in c.pending:
                    job = c.pending.pop(s.job)
                    bound.pop(s.job, None)
                    progressed = True
                    if mode == "any":
                        # As the service (cycle._apply): a floating job a cluster's cycle can
                        # never run goes back to the global queue with that cluster refused; the
                        # placement step counts it "never" once no cluster is left.
                        refused.setdefault(s.job, {})[c.name] = str(s.kind)
                        floating[s.job] = job
                    else:
                        never.add(s.job)
            if not progressed:
                return

    def requeue(name: str, c: ClusterSim, t: float) -> None:
        job = sim.jobs[name]
        if mode == "any":
            floating[name] = job
        else:
            c.pending[name] = job

    step_s: list[float] = []  # wall time of each batch's ``M.step`` (the engine's part of a step)
    batches_run: list[int] = []  # batches per placement step

    def place(t: float) -> None:
        """The placement step: the global queue's head, in global order, to the best cluster;
        as the service's ``placement_run``, then the batches behind it while the last was full,
        at most ``batches`` (and, with ``budget``, while this step's engine time is below it)."""
        trials = {}
        for c in clusters:
            u: dict[str, float] = defaultdict(float)
            for n, rj in c.running.items():
                u[rj.queue] += c.gpus_of[n]
                u[rj.queue.split("/")[0]] += c.gpus_of[n]
            limits: dict[str, float | None] = {}
            for tq in c.tree.tenants:
                limits[tq.name] = None
                for pq in tq.projects:
                    limits[pq.name] = float(pq.quota.gpus_limit) if pq.quota.gpus_limit is not None else None
            queued = sum(M.job_gpus(j) for j in c.pending.values())
            trials[c.name] = M.ClusterTrial(views[c.name], c.placer, list(c.running.values()), t,
                                            usage=dict(u), limits=limits, queued_gpus=queued,
                                            free=c.free())

        def bind(p: M.Pending, target: str, _: M.Choice) -> bool:
            """Bind or move the job: from the global queue or its cluster's queue to ``target``'s."""
            name = str(p.key)
            if p.bound is not None:
                by_name[p.bound].pending.pop(name)
            job = floating.pop(name, None) or sim.jobs[name]
            by_name[target].pending[name] = job
            bound[name] = target
            return True

        def unplaced(p: M.Pending, choice: M.Choice) -> None:
            if choice.never:  # the service rejects it: no cluster could ever run it as asked
                never.add(str(p.key))
                floating.pop(str(p.key), None)

        # As the service: the ``window`` (PLACEMENT_BATCH) oldest floating jobs still queued,
        # placed or not, then the next ``window`` behind them (``_floating_queue(after=…)``: the
        # submission order does not change within a step), each batch in the global order.
        cands = [*floating.values(), *(by_name[cn].pending[n] for n, cn in bound.items())]
        queue = heapq.nsmallest(window * batches, cands, key=lambda j: (j.submit_time, j.name))
        spent = 0.0
        n_batches = 0
        for b in range(batches):
            head = queue[b * window:(b + 1) * window]
            if not head:
                break
            # The service orders each batch by the GPUs in use per project as its trials count
            # them (running jobs plus what this step's earlier batches took).
            usage: dict[str, float] = defaultdict(float)
            for tr in trials.values():
                for q, g in tr.usage.items():
                    usage[q] += g
            order = M.global_order([(j, j.queue) for j in head], usage)
            s0 = time.perf_counter()
            M.step([M.Pending(job.name, {n: job for n in trials}, job.queue.split("/")[0],
                              needs=M.JobNeeds(gpus=M.job_gpus(job)), bound=bound.get(job.name),
                              refused=refused.get(job.name, {}))
                    for job, _ in order], list(trials.values()), bind, unplaced)
            step_s.append(time.perf_counter() - s0)
            spent += step_s[-1]
            n_batches += 1
            if len(head) < window or (budget and spent >= budget):
                break
        batches_run.append(n_batches)
        for tr in trials.values():
            tr.undo()

    while events:
        # The service coalesces cycle and placement requests; here the events up to the next
        # tick (``tick`` seconds; 0: each event time) are handled, then one placement step and
        # the changed clusters' cycles run at that tick.
        t = math.ceil(events[0][0] / tick) * tick if tick > 0 else events[0][0]
        while events and events[0][0] <= t:
            et, kind, name, tok = heapq.heappop(events)
            if last_t is not None:
                area += allocated * (et - last_t)
                area_w += allocated * max(0.0, min(et, arrivals_end) - last_t)
            last_t = et
            if kind == 1:
                job = sim.jobs[name]
                if mode == "any":
                    floating[name] = job
                else:
                    ok = [c for c in clusters if could_run(job, c)]
                    if not ok:
                        never.add(name)
                        continue
                    # uniform: any eligible cluster alike; weighted: in proportion to its GPUs
                    # (what a user spreading work by cluster size would approximate).
                    target = (rng.choices(ok, weights=[c.capacity for c in ok])[0] if pin == "weighted"
                              else rng.choice(ok))
                    target.pending[name] = job
                    dirty.add(target.name)
            elif token.get(name) == tok:
                c = by_name[where[name]]
                if name in c.running:
                    for pp in c.running.pop(name).pods:
                        c.placer.state.unreserve(pp)
                    allocated -= c.gpus_of.pop(name)
                    dirty.add(c.name)
                    changed[0] = True
        if last_t is not None:
            area += allocated * (t - last_t)
            area_w += allocated * max(0.0, min(t, arrivals_end) - last_t)
        last_t = t
        idle_beside += beside * (t - beside_at)
        if mode == "any" and (floating or (bound and changed[0])):
            before = dict(bound)
            place(t)
            dirty.update(cn for n, cn in bound.items() if before.get(n) != cn)
        changed[0] = False
        for c in clusters:
            if c.name in dirty:
                start_cycle(c, t)
        beside, beside_at = 0.0, t
        if floating or any(c.pending for c in clusters):
            beside = sum(c.free() for c in clusters
                         if floating or any(o.pending for o in clusters if o is not c))
            waiting_now = len(floating) + sum(len(c.pending) for c in clusters)
            if waiting_now > queued_peak[0]:
                queued_peak = (waiting_now, [len(c.pending) for c in clusters], t - first)
        if prof_spec[0] and prof is None and prof_until == math.inf and t - first >= float(prof_spec[0]):
            prof = cProfile.Profile()
            prof_until = time.perf_counter() + float(prof_spec[1])
            prof.enable()
        elif prof is not None and time.perf_counter() >= prof_until:
            prof.disable()
            print(f"profile ended at t={t - first:.0f}", flush=True)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
            if len(prof_spec) > 2:
                prof.dump_stats(prof_spec[2])
            prof = None
        if os.environ.get("MB_DEBUG"):
            print(f"[{time.perf_counter() - t0:.0f}s] t={t - first:.0f} "
                  f"floating {len(floating)} bound {len(bound)} "
                  f"pending {[len(c.pending) for c in clusters]} "
                  f"running {[len(c.running) for c in clusters]} "
                  f"free {[round(c.free()) for c in clusters]} "
                  f"started {len(waited)}", flush=True)
        dirty.clear()
    delays = sorted(waited.values())
    capacity = sum(c.capacity for c in clusters)
    span = (last_t or first) - first
    return {
        "mode": mode, "pin": pin if mode == "pinned" else None, "split": how, "seed": seed,
        "pods": len(sim.jobs), "started": len(waited), "never": len(never),
        "p50_delay_s": statistics.median(delays) if delays else 0.0,
        "p95_delay_s": delays[int(0.95 * (len(delays) - 1))] if delays else 0.0,
        "mean_delay_s": statistics.fmean(delays) if delays else 0.0,
        "gpu_alloc_pct": 100 * area / (span * capacity) if span else 0.0,
        "gpu_alloc_arrivals_pct": (100 * area_w / ((arrivals_end - first) * capacity)
                                   if arrivals_end > first else 0.0),
        "span_s": span, "arrival_span_s": arrivals_end - first,
        "preemptions": preemptions, "wall_s": time.perf_counter() - t0,
        "waited_over_tick": sum(1 for d in delays if d > max(tick, 1.0)),
        "queued_peak": queued_peak[0], "queued_peak_per_cluster": queued_peak[1],
        "queued_peak_at_s": queued_peak[2],
        "free_beside_queue_gpu_s": idle_beside,
        "free_beside_queue_pct": (100 * idle_beside / (span * sum(c.capacity for c in clusters))
                                  if span else 0.0),
        "placement_steps": len(batches_run),
        "batches_per_step_max": max(batches_run, default=0),
        "steps_with_more_batches": sum(1 for b in batches_run if b > 1),
        "batch_engine_s_median": statistics.median(step_s) if step_s else 0.0,
        "batch_engine_s_p95": sorted(step_s)[int(0.95 * (len(step_s) - 1))] if step_s else 0.0,
        "batch_engine_s_max": max(step_s, default=0.0),
        "clusters": {c.name: {"nodes": len(c.snap.nodes), "gpus": c.capacity,
                              "models": sorted({g.model for n in c.snap.nodes for g in n.gpus}),
                              "gpus_by_model": dict(sorted(Counter(g.model for n in c.snap.nodes
                                                                   for g in n.gpus).items()))}
                     for c in clusters},
    }


def service_window() -> int:
    """The service's ``PLACEMENT_BATCH`` (jobs one placement step takes), read from the product
    rather than copied (Django is set up for it; no database is used)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings.test")
    import django

    django.setup()
    from scheduling.services.placement import PLACEMENT_BATCH

    return PLACEMENT_BATCH


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=130)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--heads", type=int, default=0,
                    help="jobs tried per project queue and cycle (0: all, as bench/queue_replay.py's camp)")
    ap.add_argument("--window", type=int, default=0,
                    help="oldest global-queue jobs per placement step (0: the service's PLACEMENT_BATCH)")
    ap.add_argument("--batches", type=int, default=1,
                    help="batches of --window jobs per placement step at most (the service goes on while "
                         "the last batch was full and PLACEMENT_BUDGET_S of wall time is left)")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="also stop a step's batches once its engine time (M.step, measured) reaches this "
                         "many seconds (0: no budget, --batches alone bounds them)")
    ap.add_argument("--min-runtime", type=float, default=600.0)
    ap.add_argument("--load", type=float, default=1.0,
                    help="load factor k: arrival times (since the first) divided by k, durations unchanged")
    ap.add_argument("--copies", type=int, default=1,
                    help="every pod submitted this many times (the trace superposed on itself)")
    ap.add_argument("--tick", type=float, default=0.0,
                    help="seconds per scheduling tick (events coalesced; 0: a step at each event time)")
    ap.add_argument("--any-runs", type=int, default=1,
                    help="runs of 'any' (it draws nothing at random: the seed does not change it)")
    ap.add_argument("--modes", nargs="+", default=["pinned", "any"])
    ap.add_argument("--split", choices=["alternate", "model"], default="alternate",
                    help="alternate: nodes dealt alternately by size (two near-identical halves); model: "
                         "sorted by (model, GPUs per node, name), first half of the nodes to a, rest to b")
    ap.add_argument("--pin", choices=["uniform", "weighted"], default="uniform",
                    help="pinned mode: a random eligible cluster, uniformly or weighted by its GPU count")
    ap.add_argument("--out", default="multicluster.json", help="file name under bench/results/")
    args = ap.parse_args()
    args.window = args.window or service_window()
    snap, _ = load(args.stride)
    for name, part in zip(("a", "b"), split(snap, args.split), strict=True):
        kinds = Counter(f"{n.gpus[0].model}x{len(n.gpus)}" for n in part.nodes if n.gpus)
        print(f"cluster {name} ({args.split}): {len(part.nodes)} nodes, "
              f"{sum(len(n.gpus) for n in part.nodes)} GPUs, {dict(sorted(kinds.items()))}", flush=True)
    rows = []
    for mode in args.modes:
        for r in range(args.any_runs if mode == "any" else args.runs):
            row = replay(mode, args.stride, seed=r + 1, heads=args.heads, window=args.window,
                         min_runtime=args.min_runtime, load_factor=args.load, tick=args.tick,
                         copies=args.copies, batches=args.batches, budget=args.budget,
                         how=args.split, pin=args.pin)
            rows.append(row)
            print(f"{mode} seed {r + 1}: p50 {row['p50_delay_s']:.0f} s, p95 {row['p95_delay_s']:.0f} s, "
                  f"mean {row['mean_delay_s']:.0f} s, alloc {row['gpu_alloc_pct']:.1f} % "
                  f"(arrivals {row['gpu_alloc_arrivals_pct']:.1f} %), started {row['started']}, "
                  f"never {row['never']}, preemptions {row['preemptions']}, "
                  f"{row['wall_s']:.0f} s", flush=True)
            print(f"  waited over a tick {row['waited_over_tick']}; peak queue {row['queued_peak']} "
                  f"{row['queued_peak_per_cluster']} at t={row['queued_peak_at_s']:.0f} s; free GPU-s beside "
                  f"a queue elsewhere {row['free_beside_queue_gpu_s']:.0f}", flush=True)
            if mode == "any":
                print(f"  placement steps {row['placement_steps']}, more than one batch in "
                      f"{row['steps_with_more_batches']}; engine time per batch median "
                      f"{row['batch_engine_s_median']:.2f} s, p95 {row['batch_engine_s_p95']:.2f} s, "
                      f"max {row['batch_engine_s_max']:.2f} s", flush=True)
    med = {}
    for mode in args.modes:
        rs = [r for r in rows if r["mode"] == mode]
        med[mode] = {k: statistics.median(float(r[k]) for r in rs)  # type: ignore[arg-type]
                     for k in ("p50_delay_s", "p95_delay_s", "mean_delay_s", "gpu_alloc_pct",
                               "gpu_alloc_arrivals_pct", "started", "never", "preemptions", "wall_s",
                               "waited_over_tick", "queued_peak", "free_beside_queue_gpu_s")}
    print(f"\nopenb default over two clusters (every {args.stride}th openb GPU node, split {args.split}, "
          f"pinning {args.pin}): {rows[0]['clusters']}")
    print(f"load factor {args.load:g}, copies {args.copies}, tick {args.tick:g} s, heads {args.heads}, "
          f"window {args.window} x batches {args.batches}, budget {args.budget:g} s")
    print(f"{'mode':<8} {'p50 s':>8} {'p95 s':>8} {'mean s':>8} {'GPU alloc %':>11} {'arrivals %':>10} "
          f"{'started':>8} {'never':>6} {'preempt':>8} {'wall s':>7}   (medians)")
    for mode, m in med.items():
        print(f"{mode:<8} {m['p50_delay_s']:>8.0f} {m['p95_delay_s']:>8.0f} {m['mean_delay_s']:>8.0f} "
              f"{m['gpu_alloc_pct']:>11.1f} {m['gpu_alloc_arrivals_pct']:>10.1f} "
              f"{m['started']:>8.0f} {m['never']:>6.0f} {m['preemptions']:>8.0f} {m['wall_s']:>7.0f}")
    if "pinned" in med and "any" in med and med["pinned"]["p95_delay_s"]:
        cut = 1 - med["any"]["p95_delay_s"] / med["pinned"]["p95_delay_s"]
        print(f"p95 delay: any is {100 * cut:.0f} % lower than random pinning "
              f"(allocation {med['any']['gpu_alloc_pct']:.1f} % vs {med['pinned']['gpu_alloc_pct']:.1f} %)")
    loadavg = os.getloadavg()
    print(f"load average: {loadavg[0]:.2f} {loadavg[1]:.2f} {loadavg[2]:.2f}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(
        {"args": vars(args), "rows": rows, "medians": med, "loadavg": loadavg}, indent=1))


if __name__ == "__main__":
    main()
