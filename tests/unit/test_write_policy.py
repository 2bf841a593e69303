"""The cycle write step's policy steps, pure (scheduling/services/write_policy.py; issue 29):
tested on plain rows, no database."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling import engine as E
from scheduling.selectors import AllClusterLimits, AllClusterUse, GuaranteeBook, PoolAccess
from scheduling.services import write_policy as policy


@dataclass
class Row:
    pk: int
    tenant_id: int = 1
    project_id: int = 10
    cluster_id: int = 7
    preemptible: bool = True
    priority: int = 50


def placement(*nodes: str, gpus: int = 1) -> E.Placement:
    return E.Placement(tuple(
        E.PodPlacement(pod=f"p{i}", node=n, gpus=tuple(
            E.GpuGrant(index=k, uuid=f"GPU-{n}-{k}", gpu_model="A100-80G", gpu_memory_mib=81920,
                       gpu_cores_percent=100, exclusive=True) for k in range(gpus)))
        for i, n in enumerate(nodes)))


def book(**kw: object) -> GuaranteeBook:
    base: dict[str, object] = {"clusters": [7, 8], "cluster_names": {7: "east", 8: "west"}, "tenant_base": {},
                               "project_base": {}, "projects_of": {}, "preempting": {}, "heads": {}}
    base.update(kw)
    return GuaranteeBook(**base)  # type: ignore[arg-type]


def test_step_1_a_pod_on_a_pool_closed_to_the_tenant_waits() -> None:
    pools = PoolAccess(tenants={"acme-only": frozenset({2})}, models={"acme-only": frozenset({"A100-80G"})},
                       node_pool={"n2": "acme-only"})
    assert policy.outside_pools(pools, 1, placement("n1")) == ""
    assert "acme-only" in policy.outside_pools(pools, 1, placement("n1", "n2"))
    assert policy.outside_pools(pools, 2, placement("n2")) == ""


def test_step_2_a_floating_job_goes_back_instead_of_being_rejected() -> None:
    assert policy.reject_or_unplace(floating=True, cycle_of_a_cluster=True) == "unplace"
    assert policy.reject_or_unplace(floating=False, cycle_of_a_cluster=True) == "reject"
    assert policy.reject_or_unplace(floating=True, cycle_of_a_cluster=False) == "reject"


def test_step_4_admissions_that_together_cross_a_limit_across_all_clusters_wait() -> None:
    limits = AllClusterLimits(project={}, tenant={1: 2.0}, _project_tenants={10: 1})
    use = AllClusterUse()
    use.add(10, 1, 1.0, {}, cluster_id=8)  # one GPU held on the other cluster
    a, b, c = Row(1), Row(2), Row(3, tenant_id=2, project_id=20)
    keep, over = policy.within_all_clusters(
        [(a, placement("n1"), "sa"), (b, placement("n1"), "sb"), (c, placement("n1"), "sc")],
        limits, use, None)
    # a fits (2 of 2), b would make 3 of 2: it waits with the quota named; c's tenant has none.
    assert [j.pk for j, _, _ in keep] == [1, 3]
    assert [(j.pk, kind) for j, _, kind in over] == [(2, "quota")]
    assert over[0][1][0].isupper()


def test_step_4_a_non_preemptible_admission_beyond_the_guarantee_waits() -> None:
    limits = AllClusterLimits(project={}, tenant={}, _project_tenants={10: 1}, tenant_guarantee={1: 1.0})
    use = AllClusterUse()
    use.add(10, 1, 1.0, {}, cluster_id=8, nonpreemptible=True)  # the guarantee, held on west
    np_job, p_job = Row(1, preemptible=False), Row(2)
    keep, over = policy.within_all_clusters(
        [(np_job, placement("n1"), "s1"), (p_job, placement("n1"), "s2")], limits, use, book())
    assert [j.pk for j, _, _ in keep] == [2]
    assert [(j.pk, kind) for j, _, kind in over] == [(1, "guarantee")]
    assert "non-preemptible" in over[0][1]


def test_step_3_a_reclaim_relying_on_a_guarantee_held_elsewhere_evicts_nobody() -> None:
    limits = AllClusterLimits(project={}, tenant={}, _project_tenants={10: 1}, project_guarantee={10: 1.0})
    use = AllClusterUse()
    use.add(10, 1, 1.0, {}, cluster_id=8)  # the project's guarantee is used on west
    victim = Row(9, tenant_id=2, project_id=20, priority=50)
    reclaim = Row(1, priority=50)  # same priority: evicts only because the victim borrows
    by_priority = Row(2, priority=100)  # a higher priority: relies on no guarantee
    keep, refused = policy.guaranteed_preemptions(
        [(reclaim, E.Preempt(job="x", placement=placement("n1"), victims=("9",))),
         (by_priority, E.Preempt(job="x", placement=placement("n1"), victims=("9",)))],
        {9: victim}, limits, use, book())
    assert [j.pk for j, _ in keep] == [2]
    assert [j.pk for j, _ in refused] == [1] and "guarantee" in refused[0][1]
