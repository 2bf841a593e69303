"""Table-driven tests: one named case per placement rule."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from scheduling.engine import (
    Admit,
    Allocation,
    ClusterSnapshot,
    ClusterState,
    FGDPolicy,
    FragmentationPolicy,
    GpuRequest,
    JobAffinity,
    Overcommit,
    Placer,
    PodPlacement,
    PodRequest,
    Policy,
    Reject,
    ReservationError,
    ResourcePolicy,
    SharingMode,
    SliceTemplate,
    Topology,
    Wait,
    WorkloadProfile,
    align_demand,
    model_overcommit,
    node_filter,
    pod,
    schedule,
)
from scheduling.engine.model import GpuDevice, GpuGrant
from scheduling.engine.policies import expected_waste, sharing_share
from tests.unit.engine.builders import cluster, job, node

# --------------------------------------------------------------------------------------------------
# Node filter
# --------------------------------------------------------------------------------------------------

FILTER_CASES = {
    "passes": (node("n"), pod("p", gpu_count=1, cpu_millicores=1000), None),
    "unschedulable node": (node("n", schedulable=False), pod("p"), "node unschedulable"),
    "unhealthy node": (node("n", healthy=False), pod("p"), "node unhealthy"),
    "no pod slot": (node("n", max_pods=0), pod("p"), "too many pods"),
    "insufficient CPU": (node("n", cpu=1000), pod("p", cpu_millicores=2000), "insufficient CPU"),
    "insufficient RAM": (node("n", ram=1000), pod("p", ram_mib=2000), "insufficient RAM"),
    "model not allowed": (
        node("n"),
        pod("p", gpu_count=1, gpu_models={"H100"}),
        "no allowed GPU model",
    ),
    "model excluded": (
        node("n"),
        pod("p", gpu_count=1, excluded_gpu_models={"A100"}),
        "no allowed GPU model",
    ),
    "too few cards": (node("n", 2), pod("p", gpu_count=4), "too few GPUs of an allowed model"),
}


@pytest.mark.parametrize("case", FILTER_CASES, ids=list(FILTER_CASES))
def test_node_filter(case: str) -> None:
    n, p, expected = FILTER_CASES[case]
    state = ClusterState(cluster(n))
    assert node_filter(state.nodes["n"], p) == expected


# --------------------------------------------------------------------------------------------------
# Alignment
# --------------------------------------------------------------------------------------------------

HALVES = (
    SliceTemplate(20_480, 50, "half"),
    SliceTemplate(10_240, 25, "quarter"),
    SliceTemplate(40_960, 100, "whole"),
)
SIZES = (
    SliceTemplate(24_576, 100, "24GB"),
    SliceTemplate(49_152, 100, "48GB"),
    SliceTemplate(98_304, 100, "96GB"),
)


@dataclass
class AlignCase:
    request: GpuRequest
    memory_mib: int = 40_960
    sharing: SharingMode = SharingMode.SHAREABLE
    templates: tuple[SliceTemplate, ...] = ()
    expected: tuple[int, int, bool, str] | None = field(default=None)


ALIGN_CASES = {
    "slice granted as asked": AlignCase(
        GpuRequest(1, gpu_memory_mib=8000, gpu_cores_percent=30), expected=(8000, 30, False, "")
    ),
    "memory percentage is a share of this card": AlignCase(
        GpuRequest(1, gpu_memory_percent=25, gpu_cores_percent=10),
        expected=(10_240, 10, False, ""),
    ),
    "no slice means whole card": AlignCase(GpuRequest(1), expected=(40_960, 100, True, "")),
    "exclusive flag means whole card": AlignCase(
        GpuRequest(1, gpu_memory_mib=100, exclusive=True), expected=(40_960, 100, True, "")
    ),
    "exclusive-only card aligns to whole card": AlignCase(
        GpuRequest(1, gpu_memory_mib=100, gpu_cores_percent=5),
        sharing=SharingMode.EXCLUSIVE_ONLY,
        expected=(40_960, 100, True, "whole card (exclusive-only GPU)"),
    ),
    "template aligns up to the smallest fitting (quarter)": AlignCase(
        GpuRequest(1, gpu_memory_mib=9000, gpu_cores_percent=20),
        sharing=SharingMode.TEMPLATES,
        templates=HALVES,
        expected=(10_240, 25, False, "template quarter"),
    ),
    "template aligns up on cores (half)": AlignCase(
        GpuRequest(1, gpu_memory_mib=9000, gpu_cores_percent=40),
        sharing=SharingMode.TEMPLATES,
        templates=HALVES,
        expected=(20_480, 50, False, "template half"),
    ),
    "memory-size templates (24/48/96 GB)": AlignCase(
        GpuRequest(1, gpu_memory_mib=30_000, gpu_cores_percent=10),
        memory_mib=98_304,
        sharing=SharingMode.TEMPLATES,
        templates=SIZES,
        expected=(49_152, 100, False, "template 48GB"),
    ),
    "exact template is not an alignment": AlignCase(
        GpuRequest(1, gpu_memory_mib=20_480, gpu_cores_percent=50),
        sharing=SharingMode.TEMPLATES,
        templates=HALVES,
        expected=(20_480, 50, False, ""),
    ),
    "larger than the card never fits": AlignCase(
        GpuRequest(1, gpu_memory_mib=50_000, gpu_cores_percent=10), expected=None
    ),
    "larger than every template never fits": AlignCase(
        GpuRequest(1, gpu_memory_mib=30_000, gpu_cores_percent=10),
        sharing=SharingMode.TEMPLATES,
        templates=HALVES[:2],
        expected=None,
    ),
}


@pytest.mark.parametrize("case", ALIGN_CASES, ids=list(ALIGN_CASES))
def test_alignment(case: str) -> None:
    c = ALIGN_CASES[case]
    dev = GpuDevice(0, "u", "X", c.memory_mib, sharing=c.sharing, templates=c.templates)
    d = align_demand(dev, c.request)
    got = None if d is None else (d.gpu_memory_mib, d.gpu_cores_percent, d.exclusive, d.alignment)
    assert got == c.expected


def test_alignment_is_reported_in_the_grant() -> None:
    snap = cluster(node("n", 1, sharing=SharingMode.TEMPLATES, templates=HALVES))
    [d] = schedule(snap, [job("j", pod("p", gpu_count=1, gpu_memory_mib=9000, gpu_cores_percent=20))])
    assert isinstance(d, Admit)
    [g] = d.placement.pods[0].gpus
    assert (g.gpu_memory_mib, g.gpu_cores_percent) == (10_240, 25)
    assert (g.requested_memory_mib, g.requested_cores_percent) == (9000, 20)
    assert g.alignment == "template quarter"


# --------------------------------------------------------------------------------------------------
# Card fit: overcommit, sharers, exclusivity
# --------------------------------------------------------------------------------------------------


def _fill(snap: ClusterSnapshot, p: PodRequest, n: int) -> int:
    """How many copies of ``p`` fit, one by one."""
    placer = Placer(ClusterState(snap), ResourcePolicy())
    placed = 0
    for i in range(n):
        if placer.place_pod(PodRequest(f"{p.name}{i}", p.cpu_millicores, p.ram_mib, p.containers)) is None:
            break
        placed += 1
    return placed


HALF_CARD = pod("h", gpu_count=1, gpu_memory_mib=20_480, gpu_cores_percent=50)

CARD_CASES = {
    "no overcommit: two halves per card": (cluster(node("n", 1)), HALF_CARD, 2),
    "node memory+cores overcommit 2x: four halves": (
        cluster(node("n", 1, overcommit=Overcommit(memory=2.0, cores=2.0))),
        HALF_CARD,
        4,
    ),
    "memory-only overcommit is bounded by cores": (
        cluster(node("n", 1, overcommit=Overcommit(memory=2.0))),
        HALF_CARD,
        2,
    ),
    "per-model overcommit applies where the node sets none": (
        ClusterSnapshot(
            nodes=(node("n", 1),), model_overcommit=model_overcommit({"A100": Overcommit(2.0, 2.0)})
        ),
        HALF_CARD,
        4,
    ),
    "max sharers caps tiny slices": (
        cluster(node("n", 1, max_sharers=3)),
        pod("t", gpu_count=1, gpu_memory_mib=100, gpu_cores_percent=1),
        3,
    ),
    "whole cards: one per card": (cluster(node("n", 2)), pod("w", gpu_count=1), 2),
    "unhealthy card is skipped": (cluster(node("n", 2, unhealthy=(0,))), pod("w", gpu_count=1), 1),
}


@pytest.mark.parametrize("case", CARD_CASES, ids=list(CARD_CASES))
def test_card_fit(case: str) -> None:
    snap, p, expected = CARD_CASES[case]
    assert _fill(snap, p, 20) == expected


def test_exclusive_card_refuses_sharers_and_vice_versa() -> None:
    snap = cluster(node("n", 1))
    placer = Placer(ClusterState(snap), ResourcePolicy())
    assert placer.place_pod(pod("a", gpu_count=1, exclusive=True)) is not None
    assert placer.place_pod(pod("b", gpu_count=1, gpu_memory_mib=1, gpu_cores_percent=1)) is None
    placer2 = Placer(ClusterState(snap), ResourcePolicy())
    assert placer2.place_pod(pod("b", gpu_count=1, gpu_memory_mib=1, gpu_cores_percent=1))
    assert placer2.place_pod(pod("a", gpu_count=1, exclusive=True)) is None


def test_running_allocations_use_capacity() -> None:
    n = node("n", 1)
    grant = GpuGrant(0, "n-GPU-0", "A100", 30_000, 60)
    alloc = Allocation(job="old", placement=PodPlacement("old-0", "n", (grant,), 1000, 1000))
    snap = ClusterSnapshot(nodes=(n,), allocations=(alloc,))
    [d] = schedule(snap, [job("j", HALF_CARD)], ResourcePolicy())
    assert isinstance(d, Wait)


def test_reserve_checks_and_unreserve_restores() -> None:
    state = ClusterState(cluster(node("n", 1)))
    before = state.nodes["n"].signature()
    big = PodPlacement("p", "n", (GpuGrant(0, "u", "A100", 50_000, 10),))
    with pytest.raises(ReservationError):
        state.reserve(big)
    assert state.nodes["n"].signature() == before
    ok = PodPlacement("p", "n", (GpuGrant(0, "u", "A100", 20_000, 10),), 100, 100)
    state.reserve(ok)
    assert state.nodes["n"].signature() != before
    state.unreserve(ok)
    assert state.nodes["n"].signature() == before


# --------------------------------------------------------------------------------------------------
# Scoring: node × card binpack/spread, topology, load, fragmentation
# --------------------------------------------------------------------------------------------------


def _placed_on(snap: ClusterSnapshot, policy: Policy, first: list[PodRequest], p: PodRequest) -> PodPlacement:
    placer = Placer(ClusterState(snap), policy)
    for q in first:
        assert placer.place_pod(q) is not None
    out = placer.find(p)
    assert out is not None
    return out


SMALL = pod("s", gpu_count=1, gpu_memory_mib=4096, gpu_cores_percent=10)
TWO = [node("a", 2), node("b", 2)]
ISLANDS = Topology(nvlink_islands=(frozenset({0, 1}), frozenset({2, 3})))

SCORE_CASES: dict[str, tuple[ClusterSnapshot, Policy, list[PodRequest], PodRequest, str, tuple[int, ...]]] = {
    "node binpack picks the used node": (
        cluster(*TWO),
        ResourcePolicy("binpack", "binpack"),
        [pod("x", gpu_count=1, gpu_memory_mib=4096, gpu_cores_percent=10)],
        SMALL,
        "a",
        (0,),
    ),
    "node spread picks the empty node": (
        cluster(*TWO),
        ResourcePolicy("spread", "binpack"),
        [pod("x", gpu_count=1, gpu_memory_mib=4096, gpu_cores_percent=10)],
        SMALL,
        "b",
        (0,),
    ),
    "card binpack shares the used card": (
        cluster(node("a", 2)),
        ResourcePolicy("binpack", "binpack"),
        [pod("x", gpu_count=1, gpu_memory_mib=4096, gpu_cores_percent=10)],
        SMALL,
        "a",
        (0,),
    ),
    "card spread takes the idle card": (
        cluster(node("a", 2)),
        ResourcePolicy("binpack", "spread"),
        [pod("x", gpu_count=1, gpu_memory_mib=4096, gpu_cores_percent=10)],
        SMALL,
        "a",
        (1,),
    ),
    "topology keeps a 2-GPU pod in one NVLink island": (
        cluster(node("a", 4, topology=ISLANDS)),
        ResourcePolicy("binpack", "spread"),
        [pod("x", gpu_count=1, gpu_memory_mib=4096, gpu_cores_percent=10)],
        pod("t", gpu_count=2, gpu_memory_mib=4096, gpu_cores_percent=10),
        "a",
        (2, 3),
    ),
    "topology prefers one NUMA node": (
        cluster(node("a", 4, numa=(0, 1, 1, 2))),
        ResourcePolicy("binpack", "binpack"),
        [],
        pod("t", gpu_count=2),
        "a",
        (1, 2),
    ),
    "load-aware prefers the less busy card": (
        cluster(node("a", 2, utilization=(90.0, 10.0))),
        ResourcePolicy("binpack", "binpack"),
        [],
        SMALL,
        "a",
        (1,),
    ),
    "ties go to the smallest node name": (
        cluster(node("b", 2), node("a", 2), node("c", 2)),
        ResourcePolicy(),
        [],
        SMALL,
        "a",
        (0,),
    ),
}


@pytest.mark.parametrize("case", SCORE_CASES, ids=list(SCORE_CASES))
def test_scoring(case: str) -> None:
    snap, policy, first, p, want_node, want_gpus = SCORE_CASES[case]
    got = _placed_on(snap, policy, first, p)
    assert (got.node, tuple(sorted(g.index for g in got.gpus))) == (want_node, want_gpus)


def test_strict_topology_requires_one_island() -> None:
    n = node("a", 4, topology=ISLANDS)
    placer = Placer(ClusterState(cluster(n)), ResourcePolicy(strict_topology=True))
    assert placer.place_pod(pod("x", gpu_count=1)) is not None  # island 0 now has one card
    assert placer.place_pod(pod("y", gpu_count=1)) is not None
    # cards 0,1 taken: a 2-GPU pod fits island 1; a second one cannot straddle islands
    assert placer.place_pod(pod("t", gpu_count=2)) is not None
    assert placer.place_pod(pod("u", gpu_count=2)) is None
    lenient = Placer(ClusterState(cluster(n)), ResourcePolicy())
    for name in ("x", "y"):
        lenient.place_pod(pod(name, gpu_count=1, gpu_memory_mib=40_960, gpu_cores_percent=100))
    assert lenient.place_pod(pod("t", gpu_count=2)) is not None


def _profile(*shapes: tuple[PodRequest, int]) -> WorkloadProfile:
    pods = [s for s, n in shapes for _ in range(n)]
    return WorkloadProfile.from_pods(pods)


HALF = pod("h", gpu_count=1, gpu_memory_percent=50, gpu_cores_percent=50, cpu_millicores=1000)
WHOLE = pod("w", gpu_count=1, cpu_millicores=1000)


@pytest.mark.parametrize("policy_name", ["fgd", "camp"])
def test_fragmentation_aware_completes_a_half_used_card(policy_name: str) -> None:
    """A half-card pod goes to the card that is already half used: it leaves no fragment, while
    starting a fresh card would leave half a card that whole-card pods cannot use."""
    prof = _profile((HALF, 1), (WHOLE, 3))
    policy: Policy = FGDPolicy(prof) if policy_name == "fgd" else FragmentationPolicy(prof)
    snap = cluster(node("a", 2), node("b", 2))
    got = _placed_on(snap, policy, [HALF], HALF)
    first = Placer(ClusterState(snap), policy).find(HALF)
    assert first is not None
    assert (got.node, got.gpus[0].index) == (first.node, first.gpus[0].index)


def test_camp_breaks_fgd_ties_by_packing() -> None:
    """All whole cards: fragmentation is flat, FGD falls back to node names; Camp packs."""
    prof = _profile((WHOLE, 1))
    snap = cluster(node("a", 2), node("b", 2))
    fgd = _placed_on(snap, FGDPolicy(prof), [], WHOLE)
    camp_first = Placer(ClusterState(snap), FragmentationPolicy(prof))
    p1 = camp_first.place_pod(pod("w1", gpu_count=1, cpu_millicores=1000))
    assert p1 is not None and fgd.node == "a"
    p2 = camp_first.find(WHOLE)
    assert p2 is not None and p2.node == p1.node


# --------------------------------------------------------------------------------------------------
# Decisions: admit, wait, reject, gangs and job affinity
# --------------------------------------------------------------------------------------------------

DECISION_CASES = {
    "fits: admit": (cluster(node("a", 2)), job("j", pod("p", gpu_count=1)), Admit, ""),
    "larger than any node: reject": (
        cluster(node("a", 2)),
        job("j", pod("p", gpu_count=4)),
        Reject,
        "larger than any node",
    ),
    "no allowed model anywhere: reject": (
        cluster(node("a", 2)),
        job("j", pod("p", gpu_count=1, gpu_models={"H100"})),
        Reject,
        "no node has a GPU model",
    ),
    "busy now: wait with reasons": (
        cluster(node("a", 2, cpu=1000)),
        job("j", pod("p", gpu_count=1, cpu_millicores=2000)),
        Reject,
        "larger than any node",
    ),
    "gang larger than free capacity: wait": (
        cluster(node("a", 2), node("b", 2)),
        job("j", pod("p", gpu_count=2), 3),
        Wait,
        "gang of 3 pods: 2 placed",
    ),
    "gang that fits: admit all": (
        cluster(node("a", 2), node("b", 2)),
        job("j", pod("p", gpu_count=2), 2),
        Admit,
        "",
    ),
    "same-node job needing more than a node: reject": (
        cluster(node("a", 2), node("b", 2)),
        job("j", pod("p", gpu_count=1), 3, affinity=JobAffinity.SAME_NODE),
        Reject,
        "even when empty",
    ),
    "distinct-nodes job with too few nodes: reject": (
        cluster(node("a", 8)),
        job("j", pod("p", gpu_count=1), 2, affinity=JobAffinity.DISTINCT_NODES),
        Reject,
        "distinct nodes",
    ),
}


@pytest.mark.parametrize("case", DECISION_CASES, ids=list(DECISION_CASES))
def test_decisions(case: str) -> None:
    snap, j, kind, text = DECISION_CASES[case]
    [d] = schedule(snap, [j], ResourcePolicy())
    assert isinstance(d, kind)
    if text:
        assert text in d.reason  # type: ignore[union-attr]


def test_wait_reason_counts_nodes() -> None:
    snap = cluster(node("a", 1), node("b", 1, cpu=500))
    jobs = [
        job("first", pod("p", gpu_count=1)),
        job("second", pod("q", gpu_count=1, cpu_millicores=1000)),
    ]
    first, second = schedule(snap, jobs, ResourcePolicy())
    assert isinstance(first, Admit) and isinstance(second, Wait)
    assert second.reason.startswith("0/2 nodes can run 1 whole GPU(s) now:")
    assert "1 insufficient CPU" in second.reason
    assert "1 insufficient free GPU capacity" in second.reason



def test_wait_reason_follows_the_state() -> None:
    """The reason a job waits is kept per pod shape while nothing changes (a placement step asks
    it for many jobs alike); once a pod starts or ends, the next answer says what changed."""
    placer = Placer(ClusterState(cluster(node("a", 1), node("b", 1, cpu=500, max_pods=1))), ResourcePolicy())
    first = placer.place_job(job("first", pod("p", gpu_count=1, cpu_millicores=1000)))
    assert isinstance(first, Admit) and first.placement.pods[0].node == "a"
    waits = placer.place_job(job("second", pod("q", gpu_count=1, cpu_millicores=1000)))
    assert isinstance(waits, Wait)
    assert "1 insufficient free GPU capacity" in waits.reason and "1 insufficient CPU" in waits.reason
    same = placer.place_job(job("third", pod("r", gpu_count=1, cpu_millicores=1000)))
    assert same == Wait("third", waits.reason)
    # A CPU-only pod takes node b's one pod slot: b is now full for another reason.
    placer.state.reserve(PodPlacement(pod="sidecar", node="b", gpus=(), cpu_millicores=100, ram_mib=0))
    later = placer.place_job(job("third", pod("r", gpu_count=1, cpu_millicores=1000)))
    assert isinstance(later, Wait)
    assert "1 too many pods" in later.reason and "insufficient CPU" not in later.reason
    for pp in first.placement.pods:  # the first job ends: node a is free again
        placer.state.unreserve(pp)
    assert isinstance(placer.place_job(job("third", pod("r", gpu_count=1, cpu_millicores=1000))), Admit)


def test_failed_gang_rolls_back() -> None:
    state = ClusterState(cluster(node("a", 2), node("b", 2)))
    before = {n: s.signature() for n, s in state.nodes.items()}
    d = Placer(state, ResourcePolicy()).place_job(job("j", pod("p", gpu_count=2), 3))
    assert isinstance(d, Wait)
    assert {n: s.signature() for n, s in state.nodes.items()} == before


def test_non_gang_job_admits_what_fits() -> None:
    d = Placer(ClusterState(cluster(node("a", 2))), ResourcePolicy()).place_job(
        job("j", pod("p", gpu_count=1), 3, gang=False)
    )
    assert isinstance(d, Admit) and len(d.placement.pods) == 2


def test_same_node_affinity() -> None:
    snap = cluster(node("a", 2), node("b", 4))
    [d] = schedule(
        snap,
        [job("j", pod("p", gpu_count=1), 3, affinity=JobAffinity.SAME_NODE)],
        ResourcePolicy("spread", "spread"),
    )
    assert isinstance(d, Admit) and set(d.placement.nodes()) == {"b"}


def test_distinct_nodes_affinity() -> None:
    snap = cluster(node("a", 4), node("b", 4), node("c", 4))
    [d] = schedule(
        snap,
        [job("j", pod("p", gpu_count=1), 3, affinity=JobAffinity.DISTINCT_NODES)],
        ResourcePolicy(),
    )
    assert isinstance(d, Admit) and sorted(d.placement.nodes()) == ["a", "b", "c"]


def test_admitted_jobs_reserve_for_later_jobs() -> None:
    snap = cluster(node("a", 1))
    d1, d2 = schedule(snap, [job("j1", pod("p", gpu_count=1)), job("j2", pod("p", gpu_count=1))])
    assert isinstance(d1, Admit) and isinstance(d2, Wait)


def test_multi_container_pod_gets_grants_per_container() -> None:
    p = PodRequest(
        "p",
        containers=(
            GpuRequest(2, gpu_memory_mib=1000, gpu_cores_percent=10),
            GpuRequest(1, gpu_memory_mib=2000, gpu_cores_percent=20),
        ),
    )
    placer = Placer(ClusterState(cluster(node("a", 2))), ResourcePolicy())
    pp = placer.place_pod(p)
    assert pp is not None
    # Each container gets its own grants (HAMi's encoding, one list per container, is the
    # backend's: kubernetes.encode_devices).
    by_container = sorted((g.container, g.gpu_memory_mib, g.gpu_cores_percent) for g in pp.gpus)
    assert by_container == [(0, 1000, 10), (0, 1000, 10), (1, 2000, 20)]


# --------------------------------------------------------------------------------------------------
# Camp's default policy: the terms it adds to FGD
# --------------------------------------------------------------------------------------------------

T4_ONLY = pod("t4", gpu_count=1, cpu_millicores=1000, gpu_models={"T4"})
FLEX = pod("f", gpu_count=1, cpu_millicores=1000)
CPU_ONLY = pod("c", cpu_millicores=6000)
SHARE = pod("s", gpu_count=1, gpu_memory_percent=50, gpu_cores_percent=50, cpu_millicores=4000)

CAMP_CASES: dict[str, tuple[ClusterSnapshot, WorkloadProfile, PodRequest, str]] = {
    "scarcity: a flexible pod leaves cards that restricted pods need": (
        cluster(node("a", 2, model="T4", memory_mib=15_100), node("b", 2)),
        _profile((T4_ONLY, 3), (FLEX, 1)),
        FLEX,
        "b",
    ),
    "balance: a CPU-only pod goes where it starves no card": (
        cluster(node("a", 2, cpu=8000), node("b", 2, cpu=64_000)),
        _profile((SHARE, 3), (CPU_ONLY, 1)),
        CPU_ONLY,
        "b",
    ),
    "packing: near-equal gradients go to the node with fewer free cards": (
        cluster(node("a", 4), node("b", 2)),
        _profile((WHOLE, 1)),
        WHOLE,
        "b",
    ),
}


@pytest.mark.parametrize("case", CAMP_CASES, ids=list(CAMP_CASES))
def test_camp_policy_terms(case: str) -> None:
    snap, prof, p, want = CAMP_CASES[case]
    got = Placer(ClusterState(snap), FragmentationPolicy(prof)).find(p)
    assert got is not None and got.node == want


# --------------------------------------------------------------------------------------------------
# Camp's look-ahead on a card (issue 35): where a slice leaves the more usable remainder
# --------------------------------------------------------------------------------------------------


def _slice(name: str, pct: int) -> PodRequest:
    return pod(name, gpu_count=1, gpu_memory_percent=pct, gpu_cores_percent=pct, cpu_millicores=1000)


SHARING_PROFILE = _profile((_slice("big", 80), 3), (_slice("mid", 40), 2), (_slice("small", 30), 1))


def _two_partly_used_cards() -> ClusterState:
    """Card of node a 55 % used (45 % free), card of node b 40 % used (60 % free)."""
    state = ClusterState(cluster(node("a", 1), node("b", 1)))
    setup = Placer(state, ResourcePolicy())
    for name, pct in (("a", 55), ("b", 40)):
        placed = setup.find(_slice(f"on-{name}", pct), only=[name])
        assert placed is not None
        state.reserve(placed)
    return state


def test_slice_goes_where_its_remainder_stays_usable() -> None:
    """A 30 % slice on a sharing-heavy workload: on a's card it would leave 15 %, which no typical
    pod can use; on b's card it leaves 30 %, exactly a typical small pod (and a's 45 % still takes
    a 40 % pod). Camp puts it on b; FGD's gradient alone prefers a, since it counts b's 60 % as
    lost to the 80 % pods already."""
    p = _slice("new", 30)
    camp = Placer(_two_partly_used_cards(), FragmentationPolicy(SHARING_PROFILE)).find(p)
    assert camp is not None and camp.node == "b"
    gradient_only = Placer(
        _two_partly_used_cards(), FragmentationPolicy(SHARING_PROFILE, waste_weight=0.0)
    ).find(p)
    assert gradient_only is not None and gradient_only.node == "a"


def test_look_ahead_stays_off_when_whole_cards_dominate() -> None:
    """With whole-card pods carrying most of the GPU demand, the look-ahead is off: Camp decides
    exactly as without it (measured: it cost cpu250 on the openb trace)."""
    prof = _profile((WHOLE, 6), (_slice("mid", 40), 2), (_slice("small", 30), 1))
    assert sharing_share(prof) < FragmentationPolicy(prof).waste_min_sharing
    p = _slice("new", 30)
    on = Placer(_two_partly_used_cards(), FragmentationPolicy(prof)).find(p)
    off = Placer(_two_partly_used_cards(), FragmentationPolicy(prof, waste_weight=0.0)).find(p)
    assert on is not None and off is not None
    assert (on.node, on.gpus[0].index) == (off.node, off.gpus[0].index)


def test_expected_waste_of_a_gap() -> None:
    """A gap a typical pod fills exactly is no loss; one below every typical slice is all loss;
    an empty card ends with what its most likely fillings leave."""
    waste = expected_waste(SHARING_PROFILE)
    assert waste[30] == 0.0
    assert waste[15] == pytest.approx(0.15)
    assert waste[45] == pytest.approx((2 * 0.05 + 1 * 0.15) / 3)
    assert 0.0 < waste[100] < waste[15]
