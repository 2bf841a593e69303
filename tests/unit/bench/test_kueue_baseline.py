"""The Kueue baseline of docs/BENCHMARKS.md §4 (``bench.queue_replay.replay_kueue``) follows the
rules it claims from Kueue's documentation: borrowing from the cohort's unused quota, a queue
within its nominal quota reclaiming from borrowing queues (the most recently admitted first, no
more than needed), and a queue's higher-priority workload preempting its own lower-priority
ones. A baseline that does not do what its table says would make the comparison meaningless."""

from __future__ import annotations

from bench.queue_replay import PROJECTS, Sim, replay_kueue
from scheduling.engine import Job, PodGroup
from scheduling.engine.model import pod
from tests.unit.engine.builders import cluster, node


def _sim(arrivals: list[tuple[str, str, float, int]], duration: float = 1000.0) -> Sim:
    """(name, project, created, priority) per 1-GPU pod, on 8 GPUs: each project's nominal
    quota is 1 GPU, its limit 4."""
    jobs = {n: Job(name=n, groups=(PodGroup("p", pod(n, gpu_count=1, cpu_millicores=100, ram_mib=100), 1),),
                   queue=q, priority=prio, preemptible=prio == 0, submit_time=c)
            for n, q, c, prio in arrivals}
    return Sim(jobs=jobs, duration=dict.fromkeys(jobs, duration),
               created={n: c for n, _, c, _ in arrivals}, qos=dict.fromkeys(jobs, "BE"),
               capacity=8, guaranteed_milli=8 * 1000 // len(PROJECTS))


def test_a_queue_within_its_quota_reclaims_what_borrowers_took_and_no_more() -> None:
    p0, p1, p2 = PROJECTS[0], PROJECTS[1], PROJECTS[2]
    arrivals = [*((f"a{i}", p0, 0.0, 0) for i in range(4)), *((f"b{i}", p1, 1.0, 0) for i in range(4)),
                ("c0", p2, 10.0, 0)]
    sim = _sim(arrivals)
    row = replay_kueue(cluster(node("n1", 4), node("n2", 4)), sim)
    # p0 and p1 each borrow 3 of the cohort's unused quota and fill the 8 GPUs; p2's first pod is
    # within its nominal quota: one borrower is evicted (the most recently admitted: one of p1's),
    # and it starts at once.
    assert sim.started["c0"] == 10.0 and sim.waited["c0"] == 0.0
    assert row["preemptions"] == 1
    evicted = [n for n in sim.jobs if sim.waited.get(n, 0.0) > 0]
    assert len(evicted) == 1 and evicted[0].startswith("b")
    # the evicted pod waits for room within its queue's limit, then starts again from zero
    assert row["started"] == 9


def test_a_higher_priority_workload_preempts_its_own_queues_lower_priority_ones_only() -> None:
    p0 = PROJECTS[0]
    # p0 borrows up to its limit of 4 with low-priority pods; a high-priority one of p0 arrives:
    # its queue is at its limit, so it preempts one of its own (withinClusterQueue: LowerPriority).
    arrivals = [*((f"low{i}", p0, 0.0, 0) for i in range(4)), ("high", p0, 5.0, 2)]
    sim = _sim(arrivals)
    row = replay_kueue(cluster(node("n1", 4), node("n2", 4)), sim)
    assert sim.started["high"] == 5.0 and row["preemptions"] == 1
    # without a lower-priority pod to preempt, it waits for one to end
    sim = _sim([*((f"high{i}", p0, 0.0, 2) for i in range(4)), ("late", p0, 5.0, 2)])
    row = replay_kueue(cluster(node("n1", 4), node("n2", 4)), sim)
    assert row["preemptions"] == 0 and sim.started["late"] == 1000.0
