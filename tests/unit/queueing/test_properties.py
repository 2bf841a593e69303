"""Properties of a queueing cycle (hypothesis): limits hold, protected jobs are never evicted, every
eviction admits its preemptor, and (rule on) no non-preemptible job is admitted beyond a guarantee."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import Admit, ClusterState, Job, Preempt, Wait
from scheduling.engine.cycle import CycleConfig
from scheduling.engine.preemption import PreemptionConfig
from scheduling.engine.queueing import (
    Aging,
    QueueTree,
    Quota,
    RunningJob,
    TreeState,
    placement_usage,
)
from tests.unit.engine.builders import cluster, node
from tests.unit.queueing.builders import cycle, gjob, running, tree, with_running

QUEUES = ("a/x", "a/y", "b/z")
MIN_RUNTIME = 100.0
NOW = 1_000.0


@st.composite
def quotas(draw: st.DrawFn) -> Quota:
    g = draw(st.integers(0, 6))
    lim = draw(st.one_of(st.none(), st.integers(g, 10)))
    cpu = draw(st.one_of(st.none(), st.integers(2, 40)))
    cpu_g = draw(st.sampled_from([0, 0, 4, 12]))
    return Quota(gpus_guaranteed=g, gpus_limit=lim, cpu_cores_limit=cpu, cpu_cores_guaranteed=cpu_g)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[object, list[RunningJob], list[Job], QueueTree, CycleConfig]:
    sizes = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=3))
    nodes = [node(f"n{i}", s) for i, s in enumerate(sizes)]
    snap = cluster(*nodes)
    qtree = tree(
        {"a": {"x": draw(quotas()), "y": draw(quotas())}, "b": {"z": draw(quotas())}},
        tenants={"a": draw(quotas()), "b": draw(quotas())},
        cluster=Quota(
            gpus_limit=draw(st.one_of(st.none(), st.integers(4, 20))),
            gpus_guaranteed=draw(st.sampled_from([0, 0, 6])),
        ),
    )
    run: list[RunningJob] = []
    for i, s in enumerate(sizes):
        free = list(range(s))
        k = 0
        while free and draw(st.booleans()):
            take = draw(st.integers(1, len(free)))
            idx, free = tuple(free[:take]), free[take:]
            run.append(
                running(
                    f"r{i}-{k}",
                    f"n{i}",
                    idx,
                    draw(st.sampled_from(QUEUES)),
                    priority=draw(st.integers(0, 3)),
                    start=draw(st.sampled_from([0.0, 500.0, 950.0])),
                    preemptible=draw(st.booleans()),
                    checkpointable=draw(st.booleans()),
                    estimate=draw(st.one_of(st.none(), st.sampled_from([50.0, 5_000.0]))),
                )
            )
            k += 1
    pending = [
        gjob(
            f"j{i}",
            draw(st.sampled_from([1, 2, 4])),
            draw(st.sampled_from(QUEUES)),
            replicas=draw(st.integers(1, 2)),
            priority=draw(st.integers(0, 4)),
            submit=draw(st.floats(0, 999)),
            preemptible=draw(st.booleans()),
            estimate=draw(st.one_of(st.none(), st.sampled_from([10.0, 10_000.0]))),
            share=draw(st.sampled_from([0, 0, 30, 50])),
            cpu=draw(st.sampled_from([0, 1000, 8000])),
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    config = CycleConfig(
        aging=Aging(max_wait_s=draw(st.sampled_from([None, 500.0]))),
        preemption=PreemptionConfig(min_runtime_s=MIN_RUNTIME),
        backfill=draw(st.booleans()),
        nonpreemptible_within_guarantee=draw(st.booleans()),
    )
    return snap, run, pending, qtree, config


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_cycle_properties(sc: tuple[object, list[RunningJob], list[Job], QueueTree, CycleConfig]) -> None:
    snap, run, pending, qtree, config = sc
    r = cycle(snap, pending, qtree, run=run, now=NOW, config=config)  # type: ignore[arg-type]
    by_run = {j.name: j for j in run}
    by_job = {j.name: j for j in pending}

    # Victims: only preemptible jobs that ran their minimum runtime, never twice.
    evicted = [v for d in r.decisions if isinstance(d, Preempt) for v in d.victims]
    assert len(evicted) == len(set(evicted))
    assert set(evicted) == set(r.evicted)
    for v in evicted:
        rj = by_run[v]
        assert rj.preemptible, f"non-preemptible {v} evicted"
        assert NOW - (rj.start_time or 0.0) >= MIN_RUNTIME, f"{v} evicted before its minimum runtime"
    for d in r.decisions:
        if isinstance(d, Preempt):
            assert d.victims, "a preemption without victims"
            assert by_run[d.victims[0]].priority < by_job[d.job].priority or all(
                by_run[v].queue != by_job[d.job].queue for v in d.victims
                if by_run[v].priority >= by_job[d.job].priority
            )

    # Every eviction admits its preemptor: replaying the decisions on the snapshot must fit.
    state = ClusterState(with_running(snap, run))  # type: ignore[arg-type]
    for v in evicted:
        for pp in by_run[v].pods:
            state.unreserve(pp)
    for d in r.decisions:
        if isinstance(d, Admit | Preempt):
            for pp in d.placement.pods:
                state.reserve(pp)  # raises if it does not fit

    # No cycle takes a queue past its limit (or further past it, if it started beyond).
    card = {n.name: [g.memory_mib for g in n.gpus] for n in snap.nodes}  # type: ignore[attr-defined]
    before = TreeState(qtree)
    after = TreeState(qtree)
    for rj in run:
        u = placement_usage(rj.pods, card)
        before.charge(rj.queue, u)
        if rj.name not in evicted:
            after.charge(rj.queue, u)
    for d in r.decisions:
        if isinstance(d, Admit | Preempt):
            after.charge(by_job[d.job].queue, placement_usage(d.placement.pods, card))
    for n in range(len(after.names)):
        for res in range(4):
            lim = after.limit[n][res]
            if lim is None:
                continue
            assert after.usage[n][res] <= max(lim, before.usage[n][res]), (after.names[n], res)
    assert {k: v.vec() for k, v in r.usage.items()} == {
        after.names[n]: tuple(after.usage[n]) for n in range(len(after.names))
    }

    # Rule on: no admitted non-preemptible job takes a queue's non-preemptible usage beyond its
    # guarantee in a guaranteed resource it uses (running jobs already beyond it stay, untouched),
    # and none is marked borrowing where its project guarantees something.
    if config.nonpreemptible_within_guarantee:
        np_after = TreeState(qtree)
        for rj in run:
            if not rj.preemptible:
                np_after.charge(rj.queue, placement_usage(rj.pods, card))
        grew: set[tuple[int, int]] = set()
        for d in r.decisions:
            if isinstance(d, Admit | Preempt) and not by_job[d.job].preemptible:
                u = placement_usage(d.placement.pods, card)
                np_after.charge(by_job[d.job].queue, u)
                path = np_after.path_of(by_job[d.job].queue)
                grew |= {(n, res) for n in path for res in range(4) if u[res] > 0}
                pi = path[0]
                if any(after.guaranteed[pi]):
                    assert not r.statuses[d.job].borrowing, f"non-preemptible {d.job} borrowing"
        for n, res in grew:
            g = np_after.guaranteed[n][res]
            if g > 0:
                assert np_after.usage[n][res] <= g, (np_after.names[n], res, "beyond guarantee")

    # Every job not admitted has a reason and a position.
    for s in r.statuses.values():
        if isinstance(s.decision, Wait):
            assert s.decision.reason and 1 <= s.position <= s.queue_length
