"""Property tests: whatever the cluster, requests and policy, decisions never over-allocate a card
beyond its overcommit, never use an excluded (or not allowed) GPU model, never exceed a node's
CPU, RAM or pod slots, and never break a gang."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import (
    Admit,
    BestFitPolicy,
    ClusterSnapshot,
    FGDPolicy,
    FragmentationPolicy,
    GpuDevice,
    GpuRequest,
    Job,
    JobAffinity,
    Node,
    Overcommit,
    PodGroup,
    PodRequest,
    Policy,
    RandomPolicy,
    Reject,
    ResourcePolicy,
    SharingMode,
    SliceTemplate,
    Topology,
    Wait,
    WorkloadProfile,
    schedule,
)

MODELS = ("A100", "T4", "H100")
MEM = {"A100": 40_960, "T4": 16_384, "H100": 81_920}


@st.composite
def nodes(draw: st.DrawFn, i: int) -> Node:
    model = draw(st.sampled_from(MODELS))
    n = draw(st.integers(0, 8))
    sharing = draw(st.sampled_from(list(SharingMode)))
    mem = MEM[model]
    templates = (
        (
            SliceTemplate(mem // 4, 25, "q"),
            SliceTemplate(mem // 2, 50, "h"),
            SliceTemplate(mem, 100, "w"),
        )
        if sharing == SharingMode.TEMPLATES
        else ()
    )
    max_sharers = draw(st.integers(1, 6))
    gpus = tuple(
        GpuDevice(
            index=g,
            uuid=f"n{i}-g{g}",
            model=model,
            memory_mib=mem,
            numa_node=g // 4,
            sharing=sharing,
            templates=templates,
            max_sharers=max_sharers,
            healthy=draw(st.booleans()) or g > 0,
        )
        for g in range(n)
    )
    oc = draw(st.sampled_from([None, Overcommit(1.5, 1.0), Overcommit(2.0, 2.0)]))
    topo = Topology(nvlink_islands=(frozenset(range(0, min(n, 4))), frozenset(range(4, n))))
    return Node(
        name=f"n{i}",
        cpu_millicores=draw(st.sampled_from([4000, 16_000, 64_000])),
        ram_mib=draw(st.sampled_from([8192, 65_536])),
        gpus=gpus,
        max_pods=draw(st.integers(1, 12)),
        topology=topo if n > 4 and draw(st.booleans()) else Topology(),
        overcommit=oc,
    )


@st.composite
def requests(draw: st.DrawFn, name: str) -> PodRequest:
    containers = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["whole", "mib", "pct", "excl"]))
        count = draw(st.integers(1, 4))
        if kind == "whole":
            containers.append(GpuRequest(count))
        elif kind == "excl":
            containers.append(GpuRequest(count, gpu_memory_mib=1024, exclusive=True))
        elif kind == "mib":
            containers.append(
                GpuRequest(
                    count,
                    gpu_memory_mib=draw(st.integers(1, 50_000)),
                    gpu_cores_percent=draw(st.integers(0, 100)),
                )
            )
        else:
            containers.append(
                GpuRequest(
                    count,
                    gpu_memory_percent=draw(st.integers(1, 100)),
                    gpu_cores_percent=draw(st.integers(0, 100)),
                )
            )
    allowed = draw(st.sets(st.sampled_from(MODELS), max_size=2))
    excluded = draw(st.sets(st.sampled_from(MODELS), max_size=1))
    return PodRequest(
        name=name,
        cpu_millicores=draw(st.sampled_from([0, 500, 2000, 8000])),
        ram_mib=draw(st.sampled_from([0, 1024, 16_384])),
        containers=tuple(containers),
        gpu_models=frozenset(allowed),
        excluded_gpu_models=frozenset(excluded),
    )


@st.composite
def jobs(draw: st.DrawFn, i: int) -> Job:
    groups = tuple(
        PodGroup(f"g{k}", draw(requests(f"t{i}{k}")), draw(st.integers(1, 3)))
        for k in range(draw(st.integers(1, 2)))
    )
    return Job(
        name=f"j{i}",
        groups=groups,
        gang=draw(st.booleans()),
        affinity=draw(st.sampled_from(list(JobAffinity))),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[Job], Policy]:
    ns = [draw(nodes(i)) for i in range(draw(st.integers(1, 4)))]
    js = [draw(jobs(i)) for i in range(draw(st.integers(1, 6)))]
    profile = WorkloadProfile.from_pods([p for j in js for p in j.pods()])
    choices: list[Policy] = [
        FragmentationPolicy(profile),
        FragmentationPolicy(profile, strict_topology=True),
        FGDPolicy(profile),
        ResourcePolicy("binpack", "binpack"),
        ResourcePolicy("spread", "spread", strict_topology=True),
        BestFitPolicy(),
        RandomPolicy(seed=1),
    ]
    policy = draw(st.sampled_from(choices))
    return ClusterSnapshot(nodes=tuple(ns)), js, policy


def _check(snap: ClusterSnapshot, js: list[Job], decisions: list[object]) -> None:
    by_node = {n.name: n for n in snap.nodes}
    by_job = {j.name: j for j in js}
    mem: dict[tuple[str, int], int] = defaultdict(int)
    cores: dict[tuple[str, int], int] = defaultdict(int)
    sharers: dict[tuple[str, int], int] = defaultdict(int)
    excl: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    ram: dict[str, int] = defaultdict(int)
    pods: dict[str, int] = defaultdict(int)
    for d in decisions:
        assert isinstance(d, Admit | Wait | Reject)
        if not isinstance(d, Admit):
            continue
        j = by_job[d.job]
        expected = {p.name: p for p in j.pods()}
        placed = [pp.pod for pp in d.placement.pods]
        assert len(set(placed)) == len(placed)
        if j.gang:
            assert sorted(placed) == sorted(expected), "gang broken"
        if j.affinity == JobAffinity.SAME_NODE:
            assert len(set(d.placement.nodes())) == 1
        if j.affinity == JobAffinity.DISTINCT_NODES:
            assert len(set(d.placement.nodes())) == len(placed)
        for pp in d.placement.pods:
            req = expected[pp.pod]
            n = by_node[pp.node]
            cpu[n.name] += pp.cpu_millicores
            ram[n.name] += pp.ram_mib
            pods[n.name] += 1
            assert pp.cpu_millicores == req.cpu_millicores and pp.ram_mib == req.ram_mib
            per_container = defaultdict(list)
            for g in pp.gpus:
                per_container[g.container].append(g.index)
                dev = n.gpus[g.index]
                assert g.uuid == dev.uuid and dev.healthy
                assert req.allows_model(dev.model), "excluded / not allowed model used"
                assert dev.model not in req.excluded_gpu_models
                c = req.containers[g.container]
                assert g.gpu_memory_mib >= (c.gpu_memory_mib if not g.exclusive else 0)
                key = (n.name, g.index)
                sharers[key] += 1
                if g.exclusive:
                    excl[key] += 1
                else:
                    mem[key] += g.gpu_memory_mib
                    cores[key] += g.gpu_cores_percent
            for k, c in enumerate(req.containers):
                idx = per_container[k]
                assert len(idx) == c.gpu_count and len(set(idx)) == len(idx)
    for name, n in by_node.items():
        assert cpu[name] <= n.cpu_millicores and ram[name] <= n.ram_mib
        assert pods[name] <= n.max_pods
        oc = n.overcommit or Overcommit()
        for dev in n.gpus:
            key = (name, dev.index)
            assert mem[key] <= int(dev.memory_mib * oc.memory), "memory over-allocated"
            assert cores[key] <= int(100 * oc.cores), "compute over-allocated"
            assert sharers[key] <= dev.max_sharers
            if excl[key]:
                assert sharers[key] == 1, "exclusive card shared"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_decisions_respect_capacity_models_and_gangs(
    scenario: tuple[ClusterSnapshot, list[Job], Policy],
) -> None:
    snap, js, policy = scenario
    decisions = schedule(snap, js, policy)
    assert [d.job for d in decisions] == [j.name for j in js]
    _check(snap, js, list(decisions))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_default_policy_is_deterministic(
    scenario: tuple[ClusterSnapshot, list[Job], Policy],
) -> None:
    snap, js, _ = scenario
    assert schedule(snap, js) == schedule(snap, js)
