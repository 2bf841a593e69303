"""The placement rules across clusters (scheduling/engine/multicluster.py), table-driven."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from scheduling.engine import ClusterState, Placer, default_policy, pod
from scheduling.engine import multicluster as M
from scheduling.engine.model import Admit, Job, Node, PodGroup
from scheduling.engine.queueing import RunningJob

from .builders import cluster, node


def _arm(n: Node) -> Node:
    return replace(n, labels=(("kubernetes.io/arch", "arm64"),))


def _trial(name: str, *nodes: Node, labels: dict[str, str] | None = None,
           running: tuple[RunningJob, ...] = (), limits: dict[str, float | None] | None = None,
           usage: dict[str, float] | None = None,
           closed: str = "") -> M.ClusterTrial:
    snap = cluster(*nodes)
    view = M.ClusterView(name, labels=labels or {}, closed_reason=closed, arches=M.cluster_arches(snap),
                         gpu_models=frozenset(g.model for n in snap.nodes for g in n.gpus),
                         gpu_capacity=float(sum(len(n.gpus) for n in snap.nodes)))
    return M.ClusterTrial(view, Placer(ClusterState(snap), default_policy(None)), list(running), now=0.0,
                          usage=dict(usage or {}), limits=dict(limits or {}))


def _job(gpus: int, *, arches: frozenset[str] = frozenset(), priority: int = 50, models: tuple[str, ...] = ()
         ) -> Job:
    return Job("j", (PodGroup("w", pod("w", gpu_count=gpus, cpu_millicores=1000, ram_mib=1024,
                                        arches=arches, gpu_models=models)),),
               queue="t/p", priority=priority)


ANY = M.ClusterChoice()


def _choose(job: Job, *trials: M.ClusterTrial, choice: M.ClusterChoice = ANY,
            avoid: dict[str, str] | None = None) -> M.Choice:
    needs = M.JobNeeds(arches=job.groups[0].template.arches, gpus=M.job_gpus(job),
                       gpu_models=job.groups[0].template.gpu_models)
    return M.choose({t.view.name: job for t in trials}, "t", choice, needs, list(trials), avoid)


def _full(name: str) -> RunningJob:
    return RunningJob(name, (), "t/q", priority=10, preemptible=False, start_time=0.0, runtime_estimate_s=600)


def test_fits_now_beats_a_cluster_where_it_waits() -> None:
    full = _trial("a", node("a0", 4))
    full.placer.place_job(replace(_job(4), name="taken"))  # its 4 GPUs are held
    c = _choose(_job(4), full, _trial("b", node("b0", 4)))
    assert c.cluster == "b" and c.probe is not None and c.probe.outcome == M.FITS_NOW
    assert c.others and c.others[0][0] == "a"


@pytest.mark.parametrize(("arches", "expected"), [
    (frozenset({"amd64"}), "x86"),
    (frozenset({"arm64"}), "arm"),
    (frozenset(), "arm"),  # any: the larger free share wins the tie
])
def test_an_image_goes_only_where_its_arch_runs(arches: frozenset[str], expected: str) -> None:
    c = _choose(_job(1, arches=arches), _trial("x86", node("x0", 2)), _trial("arm", _arm(node("r0", 4))))
    assert c.cluster == expected
    if arches == frozenset({"amd64"}):
        assert ("arm", "the image has no arm64 variant") in c.others


def test_an_image_no_cluster_runs_is_never_placeable() -> None:
    c = _choose(_job(1, arches=frozenset({"ppc64le"})), _trial("x86", node("x0", 2)))
    assert c.cluster is None and c.never
    assert "No cluster can run it as asked" in c.reason()


def test_a_closed_or_avoided_cluster_makes_the_job_wait_not_fail() -> None:
    only = _trial("a", node("a0", 2), closed="unreachable since 10:00 UTC; it takes no new work")
    c = _choose(_job(1), only)
    assert c.cluster is None and not c.never
    assert "cluster a: unreachable" in c.reason()
    c = _choose(_job(1), _trial("a", node("a0", 2)), _trial("b", node("b0", 2)),
                avoid={"a": "its pods could not be created there: boom"})
    assert c.cluster == "b"


def test_over_the_project_limit_there_counts_as_waiting() -> None:
    limited = _trial("a", node("a0", 8), limits={"t/p": 2.0}, usage={"t/p": 2.0})
    other = _trial("b", node("b0", 1))
    c = _choose(_job(1), limited, other)
    assert c.cluster == "b"
    assert ("a", "over your project's GPU limit there (2 of 2 in use)") in c.others


def test_preemption_beats_waiting_and_fewer_victims_win() -> None:
    victim = RunningJob("v", (), "t/q", priority=10, preemptible=True)
    assert M.preemption_probe(_job(2, priority=100), [victim], free=0.0) is None  # holds no GPUs
    one = M.Probe("a", M.FITS_AFTER_PREEMPTION, victims=1, victim_gpus=1.0)
    two = M.Probe("b", M.FITS_AFTER_PREEMPTION, victims=2, victim_gpus=1.0)
    wait = M.Probe("c", M.WAITS, wait_s=60.0)
    keys = [M.rank_key(p, M.ClusterView(p.cluster), ANY, 0.0) for p in (wait, two, one)]
    assert sorted(keys) == [keys[2], keys[1], keys[0]]


def test_locality_breaks_a_tie() -> None:
    choice = M.ClusterChoice(prefer=(("region", "eu"),))
    c = _choose(_job(1), _trial("us", node("u0", 4), labels={"region": "us"}),
                _trial("eu", node("e0", 2), labels={"region": "eu"}), choice=choice)
    assert c.cluster == "eu"


def test_labels_must_all_match() -> None:
    choice = M.ClusterChoice(labels=(("region", "eu"),))
    c = _choose(_job(1), _trial("us", node("u0", 4), labels={"region": "us"}), choice=choice)
    assert c.cluster is None and ("us", "does not have region=eu") in c.others


def test_estimated_wait_from_expected_ends() -> None:
    running = [RunningJob("r1", (), "q", start_time=0.0, runtime_estimate_s=600.0),
               RunningJob("r2", (), "q", start_time=0.0, runtime_estimate_s=1200.0)]
    # No GPUs held by those (empty placements): nothing to wait for beyond what is free.
    assert M.estimated_wait(1.0, 1.0, running, now=0.0) == 0.0
    assert math.isinf(M.estimated_wait(2.0, 0.0, running, now=0.0))


def _busy_trial() -> M.ClusterTrial:
    """Two 4-GPU nodes held by three jobs: 2 GPUs end at 600 s, 4 at 1200 s, 2 at 1800 s."""
    trial = _trial("a", node("a0", 4), node("a1", 4))
    running = []
    for name, gpus, runtime in (("long", 2, 1800.0), ("mid", 4, 1200.0), ("short", 2, 600.0)):
        d = trial.placer.place_job(replace(_job(gpus), name=name), reserve=True)
        assert isinstance(d, Admit)
        running.append(RunningJob(name, d.placement.pods, "t/q", priority=90, preemptible=False,
                                  start_time=0.0, runtime_estimate_s=runtime))
    return replace(trial, running=running, free=-1.0)


def test_estimated_wait_with_the_ends_sorted_once_gives_the_same_answers() -> None:
    trial = _busy_trial()
    ends = M.running_ends(trial.running)
    assert ends == [(600.0, 2.0), (1200.0, 4.0), (1800.0, 2.0)]
    for need, ahead, expected in ((2, 0, 600.0), (4, 0, 1200.0), (4, 2, 1200.0), (4, 4, 1800.0),
                                  (8, 2, math.inf)):
        plain = M.estimated_wait(need, 0.0, trial.running, now=100.0, queued_ahead=ahead)
        once = M.estimated_wait(need, 0.0, trial.running, now=100.0, queued_ahead=ahead, ends=ends)
        assert plain == once == (expected - 100.0 if math.isfinite(expected) else math.inf)


def test_a_trial_sorts_its_running_jobs_ends_once_for_all_its_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    trial = _busy_trial()
    calls = []
    real = M.running_ends

    def counting(running: list[RunningJob]) -> list[tuple[float, float]]:
        calls.append(1)
        return real(running)

    monkeypatch.setattr(M, "running_ends", counting)
    waits = [trial.probe(replace(_job(g), name=f"w{g}"), "t", trial.free).wait_s for g in (2, 4, 4)]
    assert waits == [600.0, 1200.0, 1200.0] and len(calls) == 1
    trial.take(replace(_job(4), name="w4"), "t", trial.probe(_job(4), "t", trial.free))
    # 4 GPUs now queued ahead: the next 4-GPU job waits for the last end, still from the one sort.
    assert trial.probe(_job(4), "t", trial.free).wait_s == 1800.0 and len(calls) == 1


def test_tentative_reservations_let_the_next_job_see_what_is_left() -> None:
    a = _trial("a", node("a0", 4))
    b = _trial("b", node("b0", 4))
    first = _choose(_job(4), a, b)
    assert first.probe is not None
    {"a": a, "b": b}[first.cluster or ""].take(_job(4), "t", first.probe)
    second = _choose(_job(4), a, b)
    assert second.cluster not in (None, first.cluster)
    a.undo()
    b.undo()
    assert M.free_gpus(a.placer) == 4 and M.free_gpus(b.placer) == 4


def _pending(name: str, gpus: int, trials: tuple[M.ClusterTrial, ...], bound: str | None = None) -> M.Pending:
    j = replace(_job(gpus), name=name)
    return M.Pending(name, {t.view.name: j for t in trials}, "t", needs=M.JobNeeds(gpus=M.job_gpus(j)),
                     bound=bound)


def _recorder(binds: list[tuple[object, str]]) -> Callable[[M.Pending, str, M.Choice], bool]:
    def bind(p: M.Pending, name: str, _: M.Choice) -> bool:
        binds.append((p.key, name))
        return True
    return bind


def test_step_a_bound_job_keeps_its_room_and_the_next_job_goes_elsewhere() -> None:
    a = _trial("a", node("a0", 4))
    b = _trial("b", node("b0", 4))
    binds: list[tuple[object, str]] = []
    M.step([_pending("kept", 4, (a, b), bound="a"), _pending("new", 4, (a, b))], [a, b],
           bind=_recorder(binds))
    # "kept" fits now where it is bound: it stays (no bind) and holds a's 4 GPUs, so "new" goes to b.
    assert binds == [("new", "b")]


def test_step_moves_a_bound_job_only_for_a_strictly_better_start() -> None:
    a = _trial("a", node("a0", 4))
    a.placer.place_job(replace(_job(4), name="taken"))
    b = _trial("b", node("b0", 4))
    binds: list[tuple[object, str]] = []
    waits: list[object] = []
    M.step([_pending("stuck", 4, (a, b), bound="a"), _pending("big", 8, (a, b))], [a, b],
           bind=_recorder(binds),
           unplaced=lambda p, c: waits.append((p.key, c.never)))
    # Waiting on a, fits now on b: moved. The 8-GPU job fits no node anywhere: never.
    assert binds == [("stuck", "b")] and waits == [("big", True)]
    c = _trial("c", node("c0", 4))
    c.placer.place_job(replace(_job(4), name="taken"))
    binds.clear()
    M.step([_pending("stuck", 4, (a, c), bound="a")], [a, c],
           bind=_recorder(binds))
    assert binds == []  # waiting on both: it stays where it is


def test_step_tells_a_job_that_stays_bound_what_each_cluster_says_now_once() -> None:
    """Review finding (rv 4): a bound job's note was its bind-time one ("cluster b: fits now"
    after b closed). ``kept`` gives its own cluster's answer and each other cluster's, once."""
    a = _trial("a", node("a0", 4))
    b = _trial("b", node("b0", 4))
    kept: list[tuple[object, str, str]] = []

    def run(*trials: M.ClusterTrial) -> None:
        kept.clear()
        M.step([_pending("j", 4, trials, bound="a")], list(trials), bind=_recorder([]),
               kept=lambda p, own, others: kept.append((p.key, own, others)))
        for t in trials:
            t.undo()

    run(a, b)  # fits now on both: it stays on a (no move for an equal start); b is named once
    assert kept == [("j", "fits now", "cluster b: fits now")]
    run(a, replace(b, view=replace(b.view, closed_reason="disabled")))
    assert kept == [("j", "fits now", "cluster b: disabled")]
    run(replace(a, view=replace(a.view, closed_reason="disabled")),
        replace(b, view=replace(b.view, closed_reason="disabled")))
    assert kept == [("j", "disabled", "cluster b: disabled")]  # nowhere better: its own says why


def test_a_fresh_bind_that_still_fits_is_not_probed_elsewhere_and_keeps_its_note() -> None:
    """Issue 35 target 4: at a burst the global queue's head is jobs bound moments ago whose
    cluster's cycle has not run yet; a step probed each on every cluster again (8 clusters:
    8 probes a job, 500 jobs a batch) to find what it already knew. A fresh bind that still
    fits now where it is stays there with its room held, without probing the others (its
    note stands: ``others`` None); one that no longer fits gets the full look and moves."""
    a = _trial("a", node("a0", 4))
    b = _trial("b", node("b0", 4))
    probed: list[str] = []
    real = M.ClusterTrial.probe

    def counting(self: M.ClusterTrial, job: Job, tenant: str, free: float) -> M.Probe:
        probed.append(self.view.name)
        return real(self, job, tenant, free)

    kept: list[tuple[object, str, str | None]] = []
    binds: list[tuple[object, str]] = []
    fresh = replace(_pending("fresh", 4, (a, b), bound="a"), fresh=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(M.ClusterTrial, "probe", counting)
    try:
        M.step([fresh, _pending("new", 4, (a, b))], [a, b], bind=_recorder(binds),
               kept=lambda p, own, others: kept.append((p.key, own, others)))
    finally:
        mp.undo()
    assert probed[0] == "a" and probed.count("b") == 1  # "fresh": a only; "new": a and b
    assert kept == [("fresh", "fits now", None)]
    assert binds == [("new", "b")]  # the fresh job's room on a is held: "new" goes to b
    a.undo()
    b.undo()
    # Another cluster closed since: the full look, so the note says so.
    kept.clear()
    closed_b = replace(b, view=replace(b.view, closed_reason="disabled"))
    M.step([fresh], [a, closed_b], bind=_recorder(binds),
           kept=lambda p, own, others: kept.append((p.key, own, others)))
    assert kept == [("fresh", "fits now", "cluster b: disabled")]
    a.undo()
    # Its own cluster no longer matches the job's choice (only b allowed now): the full look.
    kept.clear()
    probed.clear()
    mp.setattr(M.ClusterTrial, "probe", counting)
    try:
        M.step([replace(fresh, choice=M.ClusterChoice.of({"clusters": ["b"]}))], [a, b],
               bind=_recorder(binds), kept=lambda p, own, others: kept.append((p.key, own, others)))
    finally:
        mp.undo()
    assert "b" in probed and all(others is not None for *_, others in kept)
    a.undo()
    b.undo()
    # No longer fits where it is bound (a is full now), fits now on b: the full look moves it.
    a.placer.place_job(replace(_job(4), name="taken"))
    binds.clear()
    M.step([fresh], [a, b], bind=_recorder(binds))
    assert binds == [("fresh", "b")]


def test_global_order_priority_then_share_then_submission() -> None:
    hi = replace(_job(1, priority=100), name="hi", queue="t/busy", submit_time=5.0)
    busy = replace(_job(1), name="busy", queue="t/busy", submit_time=1.0)
    idle = replace(_job(1), name="idle", queue="t/idle", submit_time=2.0)
    order = M.global_order([(busy, ""), (idle, ""), (hi, "")], {"t/busy": 8.0})
    assert [j.name for j, _ in order] == ["hi", "idle", "busy"]


# --- refusals lapse when what they rest on changes ---------------------------------------------

NOW = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)


def _entry(fp: str, hours_ago: float) -> dict[str, str]:
    at = NOW - dt.timedelta(hours=hours_ago)
    return {"why": "No node can ever fit", "at": at.isoformat(), "fp": fp}


def test_a_refusal_holds_while_its_fingerprint_matches_and_lapses_when_it_changes() -> None:
    big, small = node("n0", 8), node("n0", 4)
    job = _job(8)
    before = M.refusal_fingerprint(M.capacity_key([small]), job, "q1")
    assert before == M.refusal_fingerprint(M.capacity_key([small]), job, "q1")  # stable
    entries = {"b": _entry(before, 1)}
    assert M.live_refusals(entries, {"b": before}, NOW) == {"b": "No node can ever fit"}
    for changed in (M.refusal_fingerprint(M.capacity_key([big]), job, "q1"),      # a bigger node
                    M.refusal_fingerprint(M.capacity_key([small]), job, "q2"),    # a quota changed
                    M.refusal_fingerprint(M.capacity_key([small], "binpack"), job, "q1"),
                    M.refusal_fingerprint(M.capacity_key([small]), replace(job, preemptible=True), "q1"),
                    # a dedicated pool opened to the job's tenant: the models it may use there
                    M.refusal_fingerprint(M.capacity_key([small]), _job(8, models=("A100@pool",)), "q1")):
        assert changed != before
        assert M.live_refusals(entries, {"b": changed}, NOW) == {}
    # A cluster not tried now (closed) keeps its refusal; a refusal lapses after the time bound.
    assert M.live_refusals(entries, {}, NOW) == {"b": "No node can ever fit"}
    old = {"b": _entry(before, M.REFUSAL_MAX_AGE_S / 3600 + 1)}
    assert M.live_refusals(old, {"b": before}, NOW) == {}


def test_what_changes_every_minute_does_not_void_a_refusal() -> None:
    n = node("n0", 4)
    busy = replace(n, schedulable=False, gpus=tuple(replace(g, utilization_percent=90.0, foreign_sharers=1)
                                                      for g in n.gpus))
    assert M.capacity_key([n, node("n1", 4)]) == M.capacity_key([node("n1", 4), busy])


def test_old_refusals_without_a_fingerprint_are_honoured_for_the_time_bound() -> None:
    entries = {"b": "No node can ever fit"}  # the shape recorded before fingerprints
    recent = NOW - dt.timedelta(minutes=5)
    assert M.live_refusals(entries, {"b": "anything"}, NOW, recent) == {"b": "No node can ever fit"}
    assert M.live_refusals(entries, {"b": "anything"}, NOW) == {"b": "No node can ever fit"}
    stale = NOW - dt.timedelta(seconds=M.REFUSAL_MAX_AGE_S + 1)
    assert M.live_refusals(entries, {"b": "anything"}, NOW, stale) == {}


def test_a_refusal_lapses_only_with_what_its_kind_rests_on() -> None:
    """Review finding: node churn (an autoscaler, readiness flaps) lapsed every refusal, and a
    refused job went back and forth. A shape refusal rests on the distinct node shapes, a
    limit or guarantee refusal on the quotas only."""
    job = _job(8)
    two, three = [node("n0", 4), node("n1", 4)], [node("a", 4), node("b", 4), node("c", 4)]
    assert M.capacity_key(two) == M.capacity_key(three)  # more nodes like those: same verdicts
    shape = M.refusal_fingerprint(M.capacity_key(two), job, "q1", "never-fits")
    assert shape == M.refusal_fingerprint(M.capacity_key(three), job, "q2", "never-fits")
    assert shape != M.refusal_fingerprint(M.capacity_key([*two, node("big", 8)]), job, "q1", "never-fits")
    limit = M.refusal_fingerprint(M.capacity_key(two), job, "q1", "over-limit")
    assert limit == M.refusal_fingerprint(M.capacity_key([node("big", 8)]), job, "q1", "over-limit")
    assert limit != M.refusal_fingerprint(M.capacity_key(two), job, "q2", "over-limit")
    arm = replace(job, groups=(replace(job.groups[0], template=replace(job.groups[0].template,
                                                                     arches=frozenset({"arm64"}))),))
    assert shape != M.refusal_fingerprint(M.capacity_key(two), arm, "q1", "never-fits")


# --- quotas across all clusters: GPU memory per model class ------------------------------------


def _mixed_trial(memory_limits: dict[str, dict[str, int]], memory_usage: dict[tuple[str, str], int]
                 ) -> M.ClusterTrial:
    trial = _trial("m", node("a0", 4, model="A100", memory_mib=81920), node("h0", 4, model="H100",
                                                                            memory_mib=81920))
    trial.memory_limits = memory_limits
    trial.memory_usage = memory_usage
    return trial


def test_job_memory_whole_cards_and_slices() -> None:
    whole = _job(2)
    sliced = Job("s", (PodGroup("w", pod("w", gpu_count=1, gpu_memory_mib=10240, gpu_cores_percent=30),
                                replicas=3),), queue="t/p")
    assert M.job_memory(whole, 81920) == 2 * 81920
    assert M.job_memory(sliced, 81920) == 3 * 10240


def test_job_memory_counts_what_the_engine_holds_on_a_shareable_card() -> None:
    """A slice asking only compute holds no memory (the engine's alignment), a share of the card
    is rounded up, an exclusive slice takes the card: the same as the placement holds."""
    def one(**kw: int | bool) -> Job:
        return Job("s", (PodGroup("w", pod("w", gpu_count=1, **kw), replicas=2),), queue="t/p")  # type: ignore[arg-type]

    cores_only, share = one(gpu_cores_percent=50), one(gpu_memory_percent=33, gpu_cores_percent=10)
    exclusive = one(gpu_memory_mib=1024, exclusive=True)
    assert M.job_memory(cores_only, 81920) == 0
    assert M.job_memory(share, 81920) == 2 * math.ceil(33 * 81920 / 100)
    assert M.job_memory(exclusive, 81920) == 2 * 81920
    state = ClusterState(cluster(node("n0", 4, model="A100", memory_mib=81920)))
    for job in (cores_only, share, exclusive):
        d = Placer(state, default_policy(None)).place_job(job, reserve=False)
        assert isinstance(d, Admit)
        assert sum(M.placement_memory(d.placement.pods).values()) == M.job_memory(job, 81920)


def test_a_class_over_its_memory_limit_closes_its_cards_and_names_the_class() -> None:
    limits = {"t/p": {"A100": 160 * 1024}}
    # 120 GiB of A100 memory held on all clusters: 2 more A100 cards (160 GiB) would cross it.
    trial = _mixed_trial(limits, {("t/p", "A100"): 120 * 1024})
    job = _job(2)
    probe = trial.probe(job, "t", trial.free)
    assert probe.outcome == M.FITS_NOW  # on the H100 cards, which have no limit
    assert {M.model_family(g.gpu_model) for pp in probe.placement for g in pp.gpus} == {"H100"}
    only_a100 = _job(2, models=("A100",))
    probe = trial.probe(only_a100, "t", trial.free)
    assert probe.outcome == M.WAITS and probe.all_clusters
    assert probe.reason == ("over your project's A100 GPU memory limit across all clusters: "
                            "120 GiB of 160 GiB in use")
    # The tenant's limit counts too, under the tenant's name.
    trial = _mixed_trial({"t": {"A100": 160 * 1024, "H100": 160 * 1024}},
                         {("t", "A100"): 120 * 1024, ("t", "H100"): 120 * 1024})
    probe = trial.probe(job, "t", trial.free)
    assert probe.outcome == M.WAITS and "your tenant's A100 GPU memory limit" in probe.reason
    # A limit below what it asks on every class: it can never run there.
    trial = _mixed_trial({"t": {"A100": 0, "H100": 0}}, {})
    probe = trial.probe(job, "t", trial.free)
    assert probe.never and "can never run there: asks 160 GiB of A100 GPU memory in all, more than " \
        "tenant t's limit of 0 GiB of A100 GPU memory" in probe.reason


def test_placing_counts_memory_for_the_next_job_in_the_step() -> None:
    limits = {"t/p": {"A100": 160 * 1024, "H100": 160 * 1024}}
    usage: dict[tuple[str, str], int] = {}
    trial = _mixed_trial(limits, usage)
    first = _job(2)
    probe = trial.probe(first, "t", trial.free)
    assert probe.outcome == M.FITS_NOW
    trial.take(first, "t", probe)
    cls = next(iter(M.placement_memory(probe.placement)))
    assert usage == {("t/p", cls): 2 * 81920}
    # The next one fits only on the other class now.
    second = replace(_job(2), name="k")
    probe = trial.probe(second, "t", trial.free)
    assert probe.outcome == M.FITS_NOW
    assert set(M.placement_memory(probe.placement)) == {"A100", "H100"} - {cls}


# --- can never run under a quota across all clusters ------------------------------------------

_OWNERS: list[M.AllClusterOwner] = [("project t/p", 8.0, {"A100-80G": 163840}), ("tenant t", None, {})]


@pytest.mark.parametrize(("ask", "memory", "expected"), [
    (8.0, {}, None),  # exactly at the GPU limit
    (8.5, {}, "gpu_count"),
    (2.0, {"A100-80G": 163840}, None),  # exactly at the class limit
    (3.0, {"A100-80G": 245760}, "gpu_memory_mib"),  # its only usable class is over
    (3.0, {"A100-80G": 245760, "GH200-96G": 294912}, None),  # another class has no limit
    (1.0, {}, None),  # no class known: nothing refused on memory
])
def test_never_all_clusters(ask: float, memory: dict[str, int], expected: str | None) -> None:
    got = M.never_all_clusters(ask, memory, _OWNERS)
    assert (got[0] if got else None) == expected


_FOUR = {"A100-80G": 327680, "GH200-96G": 393216}  # 4 cards on A100 (320 GiB) or on GH200 (384 GiB)


@pytest.mark.parametrize(("limits", "mixed", "kept_on_one"), [
    # over 160 GiB and 192 GiB on each class alone, within them split 2 + 2
    ({"A100-80G": 163840, "GH200-96G": 196608}, None, "gpu_memory_mib"),
    ({"A100-80G": 81920, "GH200-96G": 98304}, "gpu_memory_mib", "gpu_memory_mib"),  # 176 GiB in all
    ({"A100-80G": 0}, None, None),  # GH200 has no limit
])
def test_never_all_clusters_lets_a_mixed_models_job_spread(
        limits: dict[str, int], mixed: str | None, kept_on_one: str | None) -> None:
    owners: list[M.AllClusterOwner] = [("project t/p", None, limits), ("tenant t", None, {})]
    got = M.never_all_clusters(4.0, _FOUR, owners, mixed=True)
    assert (got[0] if got else None) == mixed
    alone = M.never_all_clusters(4.0, _FOUR, owners)  # the same job kept on one model
    assert (alone[0] if alone else None) == kept_on_one


def test_never_all_clusters_for_a_mixed_job_sums_the_lower_level_per_class() -> None:
    owners: list[M.AllClusterOwner] = [("project t/p", None, {"A100-80G": 163840, "GH200-96G": 196608}),
                                       ("tenant t", None, {"A100-80G": 81920})]
    got = M.never_all_clusters(4.0, _FOUR, owners, mixed=True)
    assert got == ("gpu_memory_mib", "320 GiB of GPU memory in all, more than the GPU memory limits on "
                   "all clusters together of every GPU model class it may use (A100-80G, GH200-96G: "
                   "272 GiB in all)")


def test_never_all_clusters_names_the_quota_and_the_lower_level() -> None:
    got = M.never_all_clusters(4.0, {}, [("project t/p", 8.0, {}), ("tenant t", 3.0, {})])
    assert got == ("gpu_count",
                   "4 GPUs in all, more than tenant t's limit of 3 GPUs on all clusters together")
    both = M.never_all_clusters(2.0, {"A100-80G": 163840, "H100-80G": 163840},
                                [("project t/p", None, {"A100-80G": 81920, "H100-80G": 0})])
    assert both is not None and both[0] == "gpu_memory_mib"
    assert both[1].startswith(
        "160 GiB of A100-80G GPU memory in all, more than project t/p's limit of 80 GiB")
    assert both[1].endswith("(and over the limit of every other class it may use: H100-80G)")


def test_a_trial_says_never_only_for_what_no_usage_could_change() -> None:
    t = _trial("east", node("n0", 4), node("n1", 4))
    t.all_limits = {"t/p": 4.0}
    t.all_usage = {"t/p": 4.0}
    over = t.probe(_job(4), "t", t.free)  # at the limit, all of it held elsewhere: waits
    assert not over.never and over.all_clusters
    never = t.probe(_job(6), "t", t.free)
    assert never.never
    assert "can never run there: asks 6 GPUs in all, more than project t/p's limit" in never.reason


def test_a_mixed_models_job_refused_on_the_classes_left_open_waits_rather_than_never() -> None:
    # 6 cards, 4 of each class here; A100 over its limit now (120 of 160 GiB held elsewhere):
    # on the H100 cards alone it cannot fit, but 4 H100 + 2 A100 could once A100 memory frees.
    trial = _mixed_trial({"t/p": {"A100": 160 * 1024}}, {("t/p", "A100"): 120 * 1024})
    one_model = Job("one", (PodGroup("w", pod("w", gpu_count=1), replicas=6),), queue="t/p")
    mixed = replace(one_model, name="mixed", mixed_gpu_models=True)
    probe = trial.probe(mixed, "t", trial.free)
    assert probe.outcome == M.WAITS and not probe.never
    assert trial.probe(one_model, "t", trial.free).never  # 6 cards of one model: none has 6
