"""Table-driven rules of queueing (issue 4): one case per rule, named after it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from scheduling.engine import Admit, ClusterSnapshot, Job, Preempt, Reject, Wait
from scheduling.engine.cycle import CycleConfig, CycleResult, Kind
from scheduling.engine.preemption import PreemptionConfig
from scheduling.engine.queueing import (
    Aging,
    QueueTree,
    Quota,
    Resources,
    RunningJob,
    TreeState,
    borrowing_jobs,
    ordinal,
)
from tests.unit.engine.builders import cluster, node
from tests.unit.queueing.builders import cycle, gjob, running, tree, with_running

ONE_TENANT = tree({"t": {"p": Quota(), "q": Quota()}})
TWO_PROJECTS_GUARANTEED = tree(
    {"t": {"p": Quota(gpus_guaranteed=4), "q": Quota(gpus_guaranteed=4)}},
    tenants={"t": Quota(gpus_guaranteed=8)},
)


@dataclass
class Case:
    name: str
    snapshot: ClusterSnapshot
    pending: list[Job]
    check: Callable[[CycleResult], None]
    qtree: QueueTree = ONE_TENANT
    run: list[RunningJob] = field(default_factory=list)
    config: CycleConfig | None = None
    now: float = 1_000.0


def admitted(r: CycleResult) -> list[str]:
    return [d.job for d in r.decisions if isinstance(d, Admit | Preempt)]


def reason(r: CycleResult, job: str) -> str:
    d = r.statuses[job].decision
    assert isinstance(d, Wait | Reject), d
    return d.reason


def expect_order(*names: str) -> Callable[[CycleResult], None]:
    def check(r: CycleResult) -> None:
        assert admitted(r) == list(names)

    return check


def _quota_project_limit(r: CycleResult) -> None:
    assert admitted(r) == ["a"]
    assert r.statuses["b"].kind == Kind.QUOTA
    assert reason(r, "b").startswith(
        "Project t/p would exceed its GPU limit (3 of 4 in use, job asks 2)"
    )


def _quota_tenant_limit(r: CycleResult) -> None:
    assert admitted(r) == ["a"]
    assert "Tenant t would exceed its GPU limit (2 of 2 in use, job asks 1)" in reason(r, "b")


def _quota_cpu_limit(r: CycleResult) -> None:
    assert admitted(r) == ["a"]
    assert "Project t/p would exceed its CPU limit (6 cores of 8 cores in use, job asks 6 cores)" in reason(
        r, "b"
    )


def _over_limit(r: CycleResult) -> None:
    d = r.statuses["big"].decision
    assert isinstance(d, Reject) and r.statuses["big"].kind == Kind.OVER_LIMIT
    assert d.reason == "The job asks 8 GPU, more than Project t/p's GPU limit of 4"


def _never_fits(r: CycleResult) -> None:
    d = r.statuses["huge"].decision
    assert isinstance(d, Reject) and r.statuses["huge"].kind == Kind.NEVER_FITS
    assert d.reason == "No node can ever fit: 16 GPUs per pod, the largest node has 8"
    assert r.statuses["ok"].kind == Kind.ADMITTED


def _never_fits_model(r: CycleResult) -> None:
    assert "no node has a GPU of an allowed model (H100)" in reason(r, "h100")


def _unknown_queue(r: CycleResult) -> None:
    assert r.statuses["x"].kind == Kind.UNKNOWN_QUEUE
    assert reason(r, "x") == "Queue nope/nope does not exist on this cluster"


def _not_now_vs_never(r: CycleResult) -> None:
    assert r.statuses["later"].kind == Kind.CAPACITY
    assert isinstance(r.statuses["later"].decision, Wait)


def _capacity_reason(r: CycleResult) -> None:
    text = reason(r, "big")
    assert text.startswith("Needs 4 GPUs on one node; the largest free block is 2 (on 2 nodes)")
    assert text.endswith("1st of 1 in t/q")


def _position(r: CycleResult) -> None:
    assert admitted(r) == ["a"]
    assert [r.statuses[j].position for j in ("b", "c", "d")] == [1, 2, 3]
    assert reason(r, "c").endswith("— 2nd of 3 in t/p")
    assert r.statuses["c"].queue_length == 3


def _borrowing_mark(r: CycleResult) -> None:
    assert admitted(r) == ["a", "b"]
    assert not r.statuses["a"].borrowing and r.statuses["b"].borrowing
    assert r.borrowing == {"b"}


def _borrow_up_to_limit(r: CycleResult) -> None:
    assert admitted(r) == ["a", "b"]
    assert r.statuses["c"].kind == Kind.QUOTA


def _fair_share_projects(r: CycleResult) -> None:
    # q uses nothing, p already uses 2 of its 4 guaranteed: q's job goes first.
    assert admitted(r) == ["q1", "p1"]


def _fair_share_tenants(r: CycleResult) -> None:
    assert admitted(r)[0] == "b1"


def _aging(r: CycleResult) -> None:
    assert admitted(r) == ["old"]


def _preempt_priority(r: CycleResult) -> None:
    d = r.statuses["hi"].decision
    assert isinstance(d, Preempt) and d.victims == ("low",)
    assert r.evicted == ("low",)


def _preempt_reclaim(r: CycleResult) -> None:
    d = r.statuses["owner"].decision
    assert isinstance(d, Preempt) and d.victims == ("borrower",)


def _no_reclaim_beyond_guarantee(r: CycleResult) -> None:
    assert r.statuses["owner"].kind == Kind.CAPACITY
    assert r.evicted == ()


def _never_non_preemptible(r: CycleResult) -> None:
    assert r.statuses["hi"].kind == Kind.CAPACITY and r.evicted == ()


def _never_too_young(r: CycleResult) -> None:
    assert r.statuses["hi"].kind == Kind.CAPACITY and r.evicted == ()


def _never_useless_eviction(r: CycleResult) -> None:
    assert r.statuses["hi"].kind == Kind.CAPACITY and r.evicted == ()


def _fewest_victims(r: CycleResult) -> None:
    d = r.statuses["hi"].decision
    assert isinstance(d, Preempt) and d.victims == ("whole",)


def _lowest_priority_victim(r: CycleResult) -> None:
    d = r.statuses["hi"].decision
    assert isinstance(d, Preempt) and d.victims == ("lowest",)


def _recent_victim(r: CycleResult) -> None:
    d = r.statuses["hi"].decision
    assert isinstance(d, Preempt) and d.victims == ("recent",)


def _checkpoint_victim(r: CycleResult) -> None:
    d = r.statuses["hi"].decision
    assert isinstance(d, Preempt) and d.victims == ("ckpt",)


def _borrowing_victim_first(r: CycleResult) -> None:
    d = r.statuses["hi"].decision
    assert isinstance(d, Preempt) and d.victims == ("borrowed",)


def _gang_victims(r: CycleResult) -> None:
    d = r.statuses["gang"].decision
    assert isinstance(d, Preempt)
    assert sorted(d.victims) == ["v1", "v3"]


def _backfill_no_estimate(r: CycleResult) -> None:
    # "big" (8 GPUs) can only use the 8-GPU node: the small job may use the 4-GPU node only.
    assert r.statuses["big"].kind == Kind.CAPACITY
    assert r.statuses["big"].reserved_nodes == 1
    a = r.statuses["small"].decision
    assert isinstance(a, Admit) and a.placement.nodes() == ("four",)
    assert r.statuses["small"].backfilled
    assert r.statuses["small2"].kind == Kind.CAPACITY
    assert "held for larger jobs waiting ahead" in reason(r, "small2")


def _backfill_estimate(r: CycleResult) -> None:
    assert r.statuses["big"].kind == Kind.CAPACITY
    assert r.statuses["short"].kind == Kind.ADMITTED  # ends before "big" can start
    assert r.statuses["long"].kind == Kind.CAPACITY  # would delay "big"


def _no_backfill_for_small_waiters(r: CycleResult) -> None:
    assert admitted(r) == ["slice"]


BIG8 = cluster(node("n1", 8))
TWO4 = cluster(node("n1", 4), node("n2", 4))

CASES = [
    Case(
        "quota: a project's limit holds a job back, with a reason naming it",
        TWO4,
        [gjob("a", 3, submit=1), gjob("b", 2, submit=2)],
        _quota_project_limit,
        qtree=tree({"t": {"p": Quota(gpus_limit=4)}}),
    ),
    Case(
        "quota: an empty project limit falls back to the tenant's",
        TWO4,
        [gjob("a", 2, submit=1), gjob("b", 1, submit=2)],
        _quota_tenant_limit,
        qtree=tree({"t": {"p": Quota()}}, tenants={"t": Quota(gpus_limit=2)}),
    ),
    Case(
        "quota: every resource has a limit (CPU)",
        TWO4,
        [gjob("a", 1, cpu=6000, submit=1), gjob("b", 1, cpu=6000, submit=2)],
        _quota_cpu_limit,
        qtree=tree({"t": {"p": Quota(cpu_cores_limit=8)}}),
    ),
    Case(
        "reject: a job asking more than a limit can never run",
        TWO4,
        [gjob("big", 4, replicas=2)],
        _over_limit,
        qtree=tree({"t": {"p": Quota(gpus_limit=4)}}),
    ),
    Case(
        "reject: a shape no node can ever fit (16 GPUs per pod)",
        BIG8,
        [gjob("huge", 16), gjob("ok", 1)],
        _never_fits,
    ),
    Case(
        "reject: no node has an allowed GPU model",
        BIG8,
        [gjob("h100", 1, models=("H100",))],
        _never_fits_model,
    ),
    Case("reject: unknown queue", BIG8, [gjob("x", 1, "nope/nope")], _unknown_queue),
    Case(
        "wait: not now (capacity) is distinct from never",
        cluster(node("n1", 4)),
        [gjob("first", 4, submit=1), gjob("later", 4, submit=2)],
        _not_now_vs_never,
    ),
    Case(
        "reason: the largest free block and on how many nodes",
        TWO4,
        [gjob("big", 4, "t/q", submit=3)],
        _capacity_reason,
        run=[running("a", "n1", (0, 1)), running("b", "n2", (0, 1))],
        config=CycleConfig(preemption=PreemptionConfig(enabled=False)),
    ),
    Case(
        "reason: position in its queue",
        cluster(node("n1", 1)),
        [gjob(n, 1, submit=i) for i, n in enumerate("abcd")],
        _position,
    ),
    Case(
        "borrowing: beyond the guaranteed share on idle capacity, marked borrowing",
        TWO4,
        [gjob("a", 4, "t/p", submit=1), gjob("b", 2, "t/p", submit=2)],
        _borrowing_mark,
        qtree=TWO_PROJECTS_GUARANTEED,
    ),
    Case(
        "borrowing: up to the limit and no further",
        TWO4,
        [gjob("a", 4, submit=1), gjob("b", 2, submit=2), gjob("c", 1, submit=3)],
        _borrow_up_to_limit,
        qtree=tree({"t": {"p": Quota(gpus_guaranteed=4, gpus_limit=6)}}),
    ),
    Case(
        "order: priority class first",
        cluster(node("n1", 1)),
        [gjob("lo", 1, submit=1, priority=0), gjob("hi", 1, submit=2, priority=10)],
        expect_order("hi"),
    ),
    Case(
        "order: submit time within a project",
        cluster(node("n1", 1)),
        [gjob("second", 1, submit=2), gjob("first", 1, submit=1)],
        expect_order("first"),
    ),
    Case(
        "order: fair share between projects (lowest share of guaranteed first)",
        cluster(node("n1", 4)),
        [gjob("p1", 1, "t/p", submit=1), gjob("q1", 1, "t/q", submit=2)],
        _fair_share_projects,
        qtree=TWO_PROJECTS_GUARANTEED,
        run=[running("p-old", "n1", (0, 1), "t/p")],
    ),
    Case(
        "order: fair share between tenants before projects",
        cluster(node("n1", 4)),
        [gjob("a1", 1, "a/x", submit=1), gjob("b1", 1, "b/y", submit=2)],
        _fair_share_tenants,
        qtree=tree(
            {"a": {"x": Quota(gpus_guaranteed=1)}, "b": {"y": Quota(gpus_guaranteed=1)}},
            tenants={"a": Quota(gpus_guaranteed=2), "b": Quota(gpus_guaranteed=2)},
        ),
        run=[running("a-old", "n1", (0, 1), "a/x")],
    ),
    Case(
        "order: max-wait aging lets an old job pass a higher priority",
        cluster(node("n1", 1)),
        [gjob("old", 1, submit=0, priority=0), gjob("hi", 1, submit=900, priority=10)],
        _aging,
        config=CycleConfig(aging=Aging(max_wait_s=600)),
    ),
    Case(
        "preempt: a higher-priority job evicts a lower-priority one",
        cluster(node("n1", 4)),
        [gjob("hi", 4, priority=10)],
        _preempt_priority,
        run=[running("low", "n1", (0, 1, 2, 3), priority=0)],
    ),
    Case(
        "preempt: a job within its guaranteed share reclaims from a borrowing job",
        TWO4,
        [gjob("owner", 4, "t/q")],
        _preempt_reclaim,
        qtree=TWO_PROJECTS_GUARANTEED,
        run=[
            running("mine", "n1", (0, 1, 2, 3), "t/p", start=0),
            running("borrower", "n2", (0, 1, 2, 3), "t/p", start=10),
        ],
    ),
    Case(
        "preempt: no reclaim beyond the guaranteed share",
        TWO4,
        [gjob("owner", 4, "t/q")],
        _no_reclaim_beyond_guarantee,
        qtree=tree({"t": {"p": Quota(gpus_guaranteed=4), "q": Quota(gpus_guaranteed=2)}}),
        run=[
            running("mine", "n1", (0, 1, 2, 3), "t/p", start=0),
            running("borrower", "n2", (0, 1, 2, 3), "t/p", start=10),
        ],
    ),
    Case(
        "preempt: never a non-preemptible job",
        cluster(node("n1", 4)),
        [gjob("hi", 4, priority=10)],
        _never_non_preemptible,
        run=[running("low", "n1", (0, 1, 2, 3), preemptible=False)],
    ),
    Case(
        "preempt: never a job younger than the minimum runtime",
        cluster(node("n1", 4)),
        [gjob("hi", 4, priority=10)],
        _never_too_young,
        run=[running("low", "n1", (0, 1, 2, 3), start=900)],
        config=CycleConfig(preemption=PreemptionConfig(min_runtime_s=300)),
    ),
    Case(
        "preempt: never when the preemptor would still not fit",
        cluster(node("n1", 4)),
        [gjob("hi", 4, priority=10)],
        _never_useless_eviction,
        run=[
            running("low", "n1", (0, 1), priority=0),
            running("protected", "n1", (2, 3), priority=0, preemptible=False),
        ],
    ),
    Case(
        "victims: the fewest (one 4-GPU job rather than four 1-GPU jobs)",
        TWO4,
        [gjob("hi", 4, priority=10)],
        _fewest_victims,
        run=[running(f"s{i}", "n1", (i,), start=100 + i) for i in range(4)]
        + [running("whole", "n2", (0, 1, 2, 3), start=0)],
    ),
    Case(
        "victims: lowest priority first",
        cluster(node("n1", 2)),
        [gjob("hi", 1, priority=10)],
        _lowest_priority_victim,
        run=[running("lowest", "n1", (0,), priority=1), running("low", "n1", (1,), priority=2)],
    ),
    Case(
        "victims: most recently started first",
        cluster(node("n1", 2)),
        [gjob("hi", 1, priority=10)],
        _recent_victim,
        run=[running("old", "n1", (0,), start=0), running("recent", "n1", (1,), start=500)],
    ),
    Case(
        "victims: checkpoint-capable first",
        cluster(node("n1", 2)),
        [gjob("hi", 1, priority=10)],
        _checkpoint_victim,
        run=[
            running("plain", "n1", (0,), start=5),
            running("ckpt", "n1", (1,), start=5, checkpointable=True),
        ],
    ),
    Case(
        "victims: borrowing jobs first in line",
        cluster(node("n1", 2)),
        [gjob("hi", 1, "t/q", priority=10)],
        _borrowing_victim_first,
        qtree=tree({"t": {"p": Quota(gpus_guaranteed=1), "q": Quota(gpus_guaranteed=1)}}),
        run=[
            running("within", "n1", (0,), "t/p", start=0, priority=0),
            running("borrowed", "n1", (1,), "t/p", start=1, priority=5),
        ],
    ),
    Case(
        "victims: a gang takes the fewest across nodes",
        TWO4,
        [gjob("gang", 2, replicas=2, priority=10)],
        _gang_victims,
        run=[
            running("v1", "n1", (0, 1), start=3),
            running("keep1", "n1", (2, 3), start=1, preemptible=False),
            running("v3", "n2", (0, 1), start=4),
            running("keep2", "n2", (2, 3), start=2, preemptible=False),
        ],
    ),
    Case(
        "backfill: without estimates, only on capacity the waiting job cannot use",
        cluster(node("eight", 8), node("four", 4)),
        [gjob("big", 8, submit=1), gjob("small", 1, submit=2), gjob("small2", 4, submit=3)],
        _backfill_no_estimate,
        run=[running("busy", "eight", (0,), preemptible=False)],
    ),
    Case(
        "backfill: with estimates, jobs that end before the waiting job starts may run",
        cluster(node("eight", 8)),
        [
            gjob("big", 8, submit=1),
            gjob("short", 1, submit=2, estimate=100),
            gjob("long", 1, submit=3, estimate=10_000),
        ],
        _backfill_estimate,
        run=[running("busy", "eight", (0,), preemptible=False, start=0, estimate=2_000)],
    ),
    Case(
        "backfill: a small waiting job holds no nodes",
        cluster(node("n1", 1)),
        [gjob("whole", 1, submit=1), gjob("slice", share=50, submit=2)],
        _no_backfill_for_small_waiters,
        run=[running("half", "n1", (0,), start=0, share=50, preemptible=False)],
    ),
]


# -- Rule: non-preemptible jobs run within their queues' guaranteed share -------------------------

VISION = tree(
    {"vision": {"detection": Quota(gpus_guaranteed=8), "ocr": Quota(gpus_guaranteed=8)}},
    tenants={"vision": Quota(gpus_guaranteed=16)},
)
DET = "vision/detection"
TWO8 = cluster(node("n1", 8), node("n2", 8))
NP_OFF = CycleConfig(nonpreemptible_within_guarantee=False)


def _np_waits_beyond_guarantee(r: CycleResult) -> None:
    s = r.statuses["np"]
    assert s.kind == Kind.GUARANTEE and isinstance(s.decision, Wait)
    assert reason(r, "np") == (
        "Non-preemptible jobs must fit within Project vision/detection's GPU guarantee of 8 "
        "(non-preemptible jobs hold 6; job asks 4); non-preemptible work does not borrow idle "
        "GPUs beyond a guarantee (it could not be reclaimed) — 1st of 1 in vision/detection"
    )
    assert r.evicted == ()


def _np_preemptible_borrows(r: CycleResult) -> None:
    assert admitted(r) == ["np"] and r.statuses["np"].borrowing


def _np_within_guarantee(r: CycleResult) -> None:
    assert admitted(r) == ["np"] and not r.statuses["np"].borrowing


def _np_counts_first(r: CycleResult) -> None:
    # 4 non-preemptible + 6 preemptible on a guarantee of 8: the preemptible job started last
    # is the borrower (not the non-preemptible job, which could never be reclaimed).
    assert admitted(r) == ["np"] and not r.statuses["np"].borrowing
    assert r.borrowing == {"batch2"}


def _np_owner_reclaims(r: CycleResult) -> None:
    d = r.statuses["owner"].decision
    assert isinstance(d, Preempt) and d.victims == ("batch",)


def _np_off_owner_stuck(r: CycleResult) -> None:
    assert r.statuses["owner"].kind == Kind.CAPACITY and r.evicted == ()


def _np_tenant_level(r: CycleResult) -> None:
    assert r.statuses["np"].kind == Kind.GUARANTEE
    assert reason(r, "np").startswith(
        "Non-preemptible jobs must fit within Tenant t's GPU guarantee of 4 (non-preemptible "
        "jobs hold 2; job asks 4)"
    )


def _np_cluster_level(r: CycleResult) -> None:
    assert r.statuses["np"].kind == Kind.GUARANTEE
    assert "within Cluster cluster's GPU guarantee of 4 (non-preemptible jobs hold 3;" in reason(r, "np")


def _np_unguaranteed_resource(r: CycleResult) -> None:
    # Only CPU is guaranteed: GPUs do not restrict, CPU does.
    assert admitted(r) == ["first"]
    assert r.statuses["second"].kind == Kind.GUARANTEE
    assert reason(r, "second").startswith(
        "Non-preemptible jobs must fit within Project t/p's CPU guarantee of 8 cores (non-preemptible "
        "jobs hold 4 cores; job asks 6 cores); non-preemptible work does not borrow idle CPU"
    )


def _np_no_guarantee(r: CycleResult) -> None:
    assert admitted(r) == ["np"]


def _np_running_kept(r: CycleResult) -> None:
    assert r.evicted == ()
    assert r.statuses["owner"].kind == Kind.CAPACITY
    assert r.statuses["more"].kind == Kind.GUARANTEE
    # Held above the guarantee (kept running when it was lowered): said so, not "8 of 4" (issue 29).
    assert ("guarantee of 4 (non-preemptible jobs hold 8, more than the guarantee: admitted before "
            "it was lowered, or within a guarantee across all clusters; job asks 1)") in reason(r, "more")


def _np_never_within(r: CycleResult) -> None:
    d = r.statuses["np"].decision
    assert isinstance(d, Reject) and r.statuses["np"].kind == Kind.OVER_GUARANTEE
    assert d.reason == (
        "Non-preemptible jobs must fit within Project vision/detection's GPU guarantee of 8, and "
        "the job asks 12; non-preemptible work does not borrow idle GPUs beyond a guarantee (it "
        "could not be reclaimed)"
    )
    assert r.statuses["pre"].kind == Kind.ADMITTED


def _np_off_borrows(r: CycleResult) -> None:
    assert admitted(r) == ["np"] and r.statuses["np"].borrowing


NP_CASES = [
    Case(
        "non-preemptible within guarantee: beyond it the job waits, with the amounts and the fix",
        TWO8,
        [gjob("np", 4, DET, preemptible=False)],
        _np_waits_beyond_guarantee,
        qtree=VISION,
        run=[running("held", "n1", tuple(range(6)), DET, preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: the same job, preemptible, borrows idle GPUs",
        TWO8,
        [gjob("np", 4, DET, preemptible=True)],
        _np_preemptible_borrows,
        qtree=VISION,
        run=[running("held", "n1", tuple(range(6)), DET, preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: up to the guarantee exactly",
        TWO8,
        [gjob("np", 4, DET, preemptible=False)],
        _np_within_guarantee,
        qtree=VISION,
        run=[running("held", "n1", tuple(range(4)), DET, preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: only non-preemptible usage counts, and it counts first",
        TWO8,
        [gjob("np", 4, DET, preemptible=False)],
        _np_counts_first,
        qtree=VISION,
        run=[
            running("batch1", "n1", (0, 1, 2, 3), DET, start=0),
            running("batch2", "n1", (4, 5), DET, start=10),
        ],
    ),
    Case(
        "non-preemptible within guarantee: the owner reclaims the preemptible borrower",
        TWO4,
        [gjob("owner", 4, "t/q", preemptible=False)],
        _np_owner_reclaims,
        qtree=TWO_PROJECTS_GUARANTEED,
        run=[
            running("batch", "n1", (0, 1, 2, 3), "t/p", start=0),
            running("np", "n2", (0, 1, 2, 3), "t/p", start=10, preemptible=False),
        ],
    ),
    Case(
        "non-preemptible within guarantee (off): the owner cannot reclaim from a non-preemptible one",
        TWO4,
        [gjob("owner", 4, "t/q", preemptible=False)],
        _np_off_owner_stuck,
        qtree=TWO_PROJECTS_GUARANTEED,
        run=[
            running("batch", "n1", (0, 1, 2, 3), "t/p", start=0),
            running("np", "n2", (0, 1, 2, 3), "t/p", start=10, preemptible=False),
        ],
        config=NP_OFF,
    ),
    Case(
        "non-preemptible within guarantee: the tenant's guarantee holds too",
        TWO8,
        [gjob("np", 4, "t/p", preemptible=False)],
        _np_tenant_level,
        qtree=tree(
            {"t": {"p": Quota(gpus_guaranteed=4), "q": Quota(gpus_guaranteed=4)}},
            tenants={"t": Quota(gpus_guaranteed=4)},
        ),
        run=[running("q-np", "n1", (0, 1), "t/q", preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: and the cluster's, when it has one",
        TWO8,
        [gjob("np", 2, "t/p", preemptible=False)],
        _np_cluster_level,
        qtree=tree({"t": {"p": Quota()}}, cluster=Quota(gpus_guaranteed=4)),
        run=[running("held", "n1", (0, 1, 2), "t/p", preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: a resource without a guarantee does not restrict",
        TWO8,
        [
            gjob("first", 4, cpu=4000, submit=1, preemptible=False),
            gjob("second", 1, cpu=6000, submit=2, preemptible=False),
        ],
        _np_unguaranteed_resource,
        qtree=tree({"t": {"p": Quota(cpu_cores_guaranteed=8)}}),
    ),
    Case(
        "non-preemptible within guarantee: queues without any guarantee are not restricted",
        TWO8,
        [gjob("np", 8, preemptible=False)],
        _np_no_guarantee,
        run=[running("held", "n1", tuple(range(8)), preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: running jobs beyond it are never evicted by the rule",
        cluster(node("n1", 8)),
        [gjob("owner", 4, "t/q", submit=1), gjob("more", 1, "t/p", submit=2, preemptible=False)],
        _np_running_kept,
        qtree=TWO_PROJECTS_GUARANTEED,
        run=[running("old", "n1", tuple(range(8)), "t/p", preemptible=False)],
    ),
    Case(
        "non-preemptible within guarantee: asking more than the guarantee can never start",
        TWO8,
        [gjob("np", 4, DET, replicas=3, preemptible=False), gjob("pre", 4, DET, replicas=3)],
        _np_never_within,
        qtree=VISION,
    ),
    Case(
        "non-preemptible within guarantee (off): non-preemptible jobs borrow as before",
        TWO8,
        [gjob("np", 4, DET, preemptible=False)],
        _np_off_borrows,
        qtree=VISION,
        run=[running("held", "n1", tuple(range(6)), DET, preemptible=False)],
        config=NP_OFF,
    ),
]
CASES += NP_CASES


# --- preemption within a limit (issue 11, bug 4) -------------------------------------------

LIMITED_PROJECT = tree({"t": {"p": Quota(gpus_limit=4), "q": Quota()}})
LIMITED_TENANT = tree({"t": {"p": Quota(), "q": Quota()}, "u": {"r": Quota()}},
                      tenants={"t": Quota(gpus_limit=4)})


def _preempts(victims: tuple[str, ...], job: str = "urgent") -> Callable[[CycleResult], None]:
    def check(r: CycleResult) -> None:
        d = r.statuses[job].decision
        assert isinstance(d, Preempt), d
        assert sorted(d.victims) == sorted(victims)
        assert r.statuses[job].kind == Kind.PREEMPTING

    return check


def _waits_on_quota(job: str = "urgent") -> Callable[[CycleResult], None]:
    def check(r: CycleResult) -> None:
        assert r.statuses[job].kind == Kind.QUOTA, r.statuses[job]
        assert isinstance(r.statuses[job].decision, Wait)

    return check


LIMIT_CASES = [
    Case(
        "preemption within a limit: a project's urgent job evicts its own batch job holding the limit",
        TWO8,
        [gjob("urgent", 2, "t/p", priority=100)],
        _preempts(("batch",)),
        qtree=LIMITED_PROJECT,
        run=[running("batch", "n1", (0, 1, 2, 3), "t/p", priority=10)],
    ),
    Case(
        "preemption within a limit: the fewest victims, lowest priority first",
        TWO8,
        [gjob("urgent", 2, "t/p", priority=100)],
        _preempts(("low",)),
        qtree=LIMITED_PROJECT,
        run=[running("low", "n1", (0, 1), "t/p", priority=10),
             running("mid", "n1", (2, 3), "t/p", priority=50)],
    ),
    Case(
        "preemption within a limit: a tenant limit frees room among the tenant's other projects",
        TWO8,
        [gjob("urgent", 2, "t/p", priority=100)],
        _preempts(("other",)),
        qtree=LIMITED_TENANT,
        run=[running("other", "n1", (0, 1, 2, 3), "t/q", priority=10),
             running("stranger", "n2", (0, 1, 2, 3), "u/r", priority=0)],
    ),
    Case(
        "preemption within a limit: never jobs outside the limit (another tenant's)",
        cluster(node("n1", 8)),
        [gjob("urgent", 2, "t/p", priority=100)],
        _waits_on_quota(),
        qtree=LIMITED_TENANT,
        run=[running("mine", "n1", (0, 1, 2, 3), "t/q", priority=100),
             running("stranger", "n1", (4, 5, 6, 7), "u/r", priority=0)],
    ),
    Case(
        "preemption within a limit: never equal or higher priority, never non-preemptible",
        TWO8,
        [gjob("urgent", 2, "t/p", priority=100)],
        _waits_on_quota(),
        qtree=LIMITED_PROJECT,
        run=[running("peer", "n1", (0, 1), "t/p", priority=100),
             running("pinned", "n1", (2, 3), "t/p", priority=10, preemptible=False)],
    ),
    Case(
        "preemption within a limit: nobody is evicted when that would not be enough",
        TWO8,
        [gjob("urgent", 4, "t/p", priority=100)],
        _waits_on_quota(),
        qtree=LIMITED_PROJECT,
        run=[running("low", "n1", (0, 1), "t/p", priority=10),
             running("peer", "n1", (2, 3), "t/p", priority=100)],
    ),
    Case(
        "preemption within a limit: off when preemption is off",
        TWO8,
        [gjob("urgent", 2, "t/p", priority=100)],
        _waits_on_quota(),
        qtree=LIMITED_PROJECT,
        run=[running("batch", "n1", (0, 1, 2, 3), "t/p", priority=10)],
        config=CycleConfig(preemption=PreemptionConfig(enabled=False)),
    ),
]
CASES += LIMIT_CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rule(case: Case) -> None:
    r = cycle(case.snapshot, case.pending, case.qtree, run=case.run, now=case.now, config=case.config)
    assert set(r.statuses) == {j.name for j in case.pending}
    for s in r.statuses.values():
        if isinstance(s.decision, Wait):
            assert s.decision.reason and s.position >= 1, s
    case.check(r)


def test_borrowing_jobs_are_the_most_recently_started() -> None:
    ts = TreeState(tree({"t": {"p": Quota(gpus_guaranteed=2)}}))
    run = [running(f"j{i}", "n1", (i,), start=i) for i in range(4)]
    usage = {r.name: [1000, 0, 0, 0] for r in run}
    assert borrowing_jobs(ts, usage, run) == {"j2", "j3"}


def test_fair_share_is_dominant_share_over_guaranteed() -> None:
    ts = TreeState(tree({"t": {"p": Quota(gpus_guaranteed=4, cpu_cores_guaranteed=10)}}))
    pi = ts.project_index["t/p"]
    ts.charge("t/p", Resources.of(gpus=1, cpu_cores=5).vec())
    assert ts.share(pi) == pytest.approx(0.5)


def test_quota_mirrors_django_fields() -> None:
    q = Quota(gpus_guaranteed=1.5, gpus_limit=2.25, cpu_cores_limit=3, ram_mib_limit=1024)
    assert q.guaranteed() == Resources(gpu_milli=1500)
    assert q.limits() == (2250, None, 3000, 1024)


def test_ordinal() -> None:
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]


def test_a_reclaimed_borrower_does_not_take_back_the_room_it_was_evicted_for() -> None:
    """The living demo's livelock (issue 32): a high-priority borrower of tenant ``v`` fills the
    cluster; a normal notebook of tenant ``l`` within its guarantee reclaims; once the borrower
    is released both are pending. Ordered by priority alone the borrower went first, took the
    room back and was evicted again the next cycle, over and over. Guaranteed work goes first:
    the notebook is admitted and the borrower waits."""
    qtree = tree({"v": {"det": Quota()}, "l": {"llm": Quota(gpus_guaranteed=1)}},
                 tenants={"l": Quota(gpus_guaranteed=1)})
    snap = cluster(node("n1", 4))
    sweep = gjob("sweep", 4, "v/det", priority=100, submit=0.0)
    notebook = gjob("notebook", 1, "l/llm", priority=50, submit=10.0, preemptible=False)
    first = cycle(snap, [notebook], qtree, run=[running("sweep", "n1", (0, 1, 2, 3), "v/det", priority=100)])
    d = first.statuses["notebook"].decision
    assert isinstance(d, Preempt) and d.victims == ("sweep",)  # the reclaim
    # the sweep released and requeued: both wait for the same four cards
    after = cycle(snap, [sweep, notebook], qtree)
    assert admitted(after) == ["notebook"]
    assert after.statuses["sweep"].kind == Kind.CAPACITY
    # and the next cycle keeps it that way: nothing to evict, nothing re-admitted
    again = cycle(snap, [sweep], qtree, run=[running("notebook", "n1", (0,), "l/llm", priority=50,
                                                         preemptible=False)])
    assert admitted(again) == [] and again.evicted == ()


# --- heads that follow the free room (CycleConfig.heads_fill, issue 35) ------------------------

FILL = CycleConfig(heads_per_queue=1, heads_fill=True)


def _kinds(r: CycleResult) -> dict[str, str]:
    return {name: s.kind for name, s in r.statuses.items()}


def test_heads_follow_the_free_room_by_what_the_jobs_ask() -> None:
    """Twelve quarter-card slices on four free cards: the queue's share is the four GPUs, the
    slices ask three, so all twelve are offered and admitted in one cycle. Counting jobs, not
    their asks, offered four (one per free GPU), and without fill only the configured head."""
    pending = [gjob(f"s{i}", share=25, queue="t/p", submit=i) for i in range(12)]
    snapshot = cluster(node("n1", 4))
    filled = cycle(snapshot, pending, ONE_TENANT, config=FILL)
    assert sorted(admitted(filled)) == sorted(j.name for j in pending)
    plain = cycle(snapshot, pending, ONE_TENANT, config=CycleConfig(heads_per_queue=1))
    assert admitted(plain) == ["s0"]
    assert list(_kinds(plain).values()).count(Kind.BEHIND) == 11


def test_a_second_pass_fills_the_room_the_first_left() -> None:
    """Two queues share four free cards (two GPUs each by share). Queue p asks one whole card,
    queue q twelve quarter cards: the first pass offers p's job and eight of q's (two GPUs of
    asks); one card is left, so a second pass in the same cycle offers q's last four, which fit.
    Everything that fits is admitted by one cycle, as the next cycle would have done."""
    pending = [gjob("whole", 1, "t/p"), *(gjob(f"s{i}", share=25, queue="t/q", submit=i) for i in range(12))]
    r = cycle(cluster(node("n1", 4)), pending, ONE_TENANT, config=FILL)
    assert sorted(admitted(r)) == sorted(j.name for j in pending)
    assert [d.job for d in r.decisions if isinstance(d, Admit)][-4:] == ["s8", "s9", "s10", "s11"]


def test_a_full_cluster_offers_only_the_configured_heads() -> None:
    """No free room (every card held by a running job): the fill adds nobody, the jobs past the
    configured heads wait behind with their positions."""
    run = [running(f"r{i}", "n1", (i,), "t/q") for i in range(4)]
    pending = [gjob(f"p{i}", 1, "t/p", submit=i) for i in range(5)]
    r = cycle(cluster(node("n1", 4)), pending, ONE_TENANT, run=run,
              config=CycleConfig(heads_per_queue=2, heads_fill=True,
                                 preemption=PreemptionConfig(enabled=False)))
    kinds = _kinds(r)
    assert [kinds[f"p{i}"] for i in range(5)] == [Kind.CAPACITY] * 2 + [Kind.BEHIND] * 3
    assert r.statuses["p4"].position == 5


def test_free_room_counts_only_what_could_still_be_placed() -> None:
    """The free room is each usable card's free share in the one GPU unit, on schedulable,
    healthy nodes: a card held whole, one with every sharer slot taken, an unhealthy card and an
    unschedulable node's cards count nothing; a half-used card counts its free half."""
    from scheduling.engine import ClusterState

    snap = cluster(node("n1", 4, max_sharers=2, unhealthy=(3,)), node("n2", 2, schedulable=False))
    run = [running("whole", "n1", (0,)), running("half", "n1", (1,), share=50),
           running("a", "n1", (2,), share=10), running("b", "n1", (2,), share=10)]
    state = ClusterState(with_running(snap, run))
    # n1: card 0 held whole (0), card 1 half free (500), card 2 sharers full (0), card 3 unhealthy
    assert state.free_room() == (500, 64_000)


def test_a_refill_pass_admits_into_free_room_and_evicts_nobody() -> None:
    """The refill pass only fills free room: a job behind the heads that does not fit waits
    for capacity rather than preempting (as a head, in the next cycle, it may). Three cards
    free, two queues: p offers its 2-card job (its share is 1.5 GPUs), r its quarter slice;
    the second pass offers p's 1-card job, for which only three quarters of a card are left."""
    qtree = tree({"t": {"p": Quota(), "q": Quota(), "r": Quota()}})
    run = [running("low", "n1", (3,), "t/q", priority=1)]
    pending = [gjob("a", 2, "t/p", priority=5), gjob("b", 1, "t/p", priority=3),
               gjob("c", share=25, queue="t/r")]
    r = cycle(cluster(node("n1", 4)), pending, qtree, run=run, config=FILL)
    kinds = _kinds(r)
    assert sorted(admitted(r)) == ["a", "c"] and kinds["b"] == Kind.CAPACITY and not r.evicted
    # the same job as a head preempts the lower-priority one
    head = cycle(cluster(node("n1", 4)), [gjob("b", 1, "t/p", priority=3)], qtree,
                 run=[running("low", "n1", (0, 1, 2, 3), "t/q", priority=1)], config=FILL)
    assert _kinds(head)["b"] == Kind.PREEMPTING


def test_a_refill_pass_leaves_the_room_of_this_cycles_victims_alone() -> None:
    """A head preempts the job holding n1; a refill pass in the same cycle does not place the
    jobs behind it on n1, whose cards the victim's pods hold until they stop (the write would
    refuse them as taken): they wait for capacity."""
    qtree = tree({"t": {"p": Quota(), "q": Quota(), "r": Quota()}})
    run = [running("low", "n1", (0, 1, 2, 3), "t/q", priority=1)]
    pending = [gjob("a", 2, "t/p", priority=100), gjob("b", 1, "t/p", priority=50),
               gjob("c", 1, "t/p", priority=50, submit=1), gjob("x", 1, "t/r")]
    r = cycle(cluster(node("n1", 4), node("n2", 1)), pending, qtree, run=run, config=FILL)
    kinds = _kinds(r)
    assert kinds["a"] == Kind.PREEMPTING and kinds["x"] == Kind.ADMITTED
    assert kinds["b"] == kinds["c"] == Kind.CAPACITY


def test_heads_follow_free_cpu_when_no_gpu_is_free() -> None:
    """Every card held, CPU free: CPU-only jobs are still offered by their share of the free
    CPU (the GPU share bounds only jobs that ask GPUs), all admitted in one cycle."""
    run = [running(f"r{i}", "n1", (i,), "t/q") for i in range(4)]
    pending = [gjob(f"cpu{i}", 0, "t/p", cpu=1000, submit=i) for i in range(10)]
    r = cycle(cluster(node("n1", 4)), pending, ONE_TENANT, run=run, config=FILL)
    assert sorted(admitted(r)) == sorted(j.name for j in pending)
