"""What one placement step's probes cost on two full halves of the openb cluster (issue 16).

Each half (``bench.multicluster.split`` of all openb GPU nodes: 607 and 606 nodes, ~3,100
GPUs) is filled with trace pods (the default trace, cycled) until about ``--running`` jobs run
there, each with its trace duration as its expected runtime; then ``multicluster.step`` (the
loop the service's ``placement_run`` calls) takes ``--jobs`` further trace pods in the global
order, as a placement step over a full global queue does. Reported: the median wall time of
``--repeat`` steps (fresh trials each time; their reservations undone after) and the time per
probe. Used in docs/BENCHMARKS.md §9 to compare ``estimated_wait`` sorting the running jobs'
ends on each probe (``--sort-each-probe``: as before the fix) with once per trial (now), and
``Placer.why_not`` walking every node state on each failed probe (``--no-why-memo``) with its
text kept per pod shape until the state changes (now).

    .venv/bin/python -m bench.placement_probe_cost                      # ~1–2 min
    .venv/bin/python -m bench.placement_probe_cost --sort-each-probe    # before the first fix
    .venv/bin/python -m bench.placement_probe_cost --no-why-memo        # before the second
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

from bench.multicluster import split
from bench.queue_replay import load
from scheduling.engine import ClusterState, FragmentationPolicy, Placer, WorkloadProfile
from scheduling.engine import multicluster as M
from scheduling.engine.model import Admit
from scheduling.engine.placement import model_family
from scheduling.engine.queueing import RunningJob


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--running", type=int, default=4000, help="running jobs per cluster (at most)")
    ap.add_argument("--jobs", type=int, default=500, help="jobs in the step (the service's PLACEMENT_BATCH)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--sort-each-probe", action="store_true",
                    help="as before the fix: each probe sorts the running jobs' ends again")
    ap.add_argument("--no-why-memo", action="store_true",
                    help="as before the fix: each failed probe counts every node state again for its reason")
    args = ap.parse_args()
    if args.no_why_memo:
        Placer.why_not = lambda self, pod, *, exclude=(): self._why_not(pod, exclude)  # type: ignore[method-assign]
    if args.sort_each_probe:
        M.ClusterTrial.ends = lambda self: M.running_ends(self.running)  # type: ignore[method-assign]
    snap, sim = load(1)
    profile = WorkloadProfile.from_pods([j.groups[0].template for j in sim.jobs.values()])
    names = list(sim.jobs)
    clusters = []
    k = 0
    for cname, part in zip(("a", "b"), split(snap), strict=True):
        placer = Placer(ClusterState(part), FragmentationPolicy(profile))
        running: list[RunningJob] = []
        misses = 0
        while len(running) < args.running and misses < 2000:
            name = names[k % len(names)]
            job = replace(sim.jobs[name], name=f"{name}@{k}")
            k += 1
            d = placer.place_job(job, reserve=True)
            if not isinstance(d, Admit):
                misses += 1
                continue
            misses = 0
            running.append(RunningJob(job.name, d.placement.pods, job.queue, job.priority, job.preemptible,
                                      False, 0.0, sim.duration[name]))
        models = frozenset(model_family(g.model) for n in part.nodes for g in n.gpus)
        capacity = float(sum(len(n.gpus) for n in part.nodes))
        view = M.ClusterView(cname, gpu_models=models, gpu_capacity=capacity)
        clusters.append((view, placer, running))
    waiting = [replace(sim.jobs[names[(k + i) % len(names)]], name=f"wait{i}") for i in range(args.jobs)]
    times, probes = [], 0
    for _ in range(args.repeat):
        trials = [M.ClusterTrial(v, p, r, now=100.0) for v, p, r in clusters]
        order = M.global_order([(j, j.queue) for j in waiting], {})
        pend = [M.Pending(j.name, {t.view.name: j for t in trials}, j.queue.split("/")[0],
                          needs=M.JobNeeds(gpus=M.job_gpus(j))) for j, _ in order]
        t0 = time.perf_counter()
        M.step(pend, trials, bind=lambda p, n, c: True)
        times.append(time.perf_counter() - t0)
        probes = len(pend) * len(trials)
        for t in trials:
            t.undo()
    med = statistics.median(times)
    load_avg = os.getloadavg()
    print(f"running jobs per cluster: {[len(r) for _, _, r in clusters]}; free GPUs: "
          f"{[round(M.free_gpus(p)) for _, p, _ in clusters]}")
    print(f"step over {args.jobs} jobs x 2 clusters: median {med:.2f} s of {args.repeat} "
          f"({', '.join(f'{x:.2f}' for x in times)}); {1000 * med / probes:.1f} ms a probe; "
          f"load average {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}")


if __name__ == "__main__":
    main()
