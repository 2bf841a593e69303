"""The split of a GPU guarantee across all clusters into per-cluster parts (engine/guarantees.py)."""

from __future__ import annotations

import pytest

from scheduling.engine.guarantees import Holding, Owner, split_guarantee, split_tenant

AB = ["a", "b"]


def test_nothing_held_the_whole_guarantee_goes_to_the_head_cluster_only() -> None:
    # Defect 1 of the first design: the whole guarantee counted on every cluster at once.
    parts = split_guarantee(Owner(4.0, head="b"), AB)
    assert parts == {"a": 0.0, "b": 4.0}
    assert sum(parts.values()) == 4.0


def test_without_a_head_the_first_cluster_by_order_takes_the_rest() -> None:
    assert split_guarantee(Owner(4.0), AB) == {"a": 4.0, "b": 0.0}


def test_what_is_held_is_covered_first_then_the_rest_to_the_head() -> None:
    owner = Owner(6.0, holdings={"a": Holding(held=2.0), "b": Holding(held=1.0)}, head="a")
    assert split_guarantee(owner, AB) == {"a": 5.0, "b": 1.0}


def test_a_waiting_preemptor_counted_as_held_keeps_its_part_where_it_reclaims() -> None:
    # The preemptor's ask (4) is part of "held" on b: the parts stay there, not with a new head.
    owner = Owner(4.0, holdings={"b": Holding(held=4.0)}, head="a")
    assert split_guarantee(owner, AB) == {"a": 0.0, "b": 4.0}


def test_held_beyond_the_guarantee_never_makes_the_parts_sum_to_more() -> None:
    owner = Owner(4.0, holdings={"a": Holding(held=8.0), "b": Holding(held=8.0)}, head="b")
    parts = split_guarantee(owner, AB)
    assert parts == {"a": 4.0, "b": 0.0} and sum(parts.values()) == 4.0


def test_non_preemptible_work_is_covered_before_preemptible_work_of_an_earlier_cluster() -> None:
    owner = Owner(4.0, holdings={"a": Holding(held=4.0), "b": Holding(held=2.0, nonpreemptible=2.0)})
    assert split_guarantee(owner, AB) == {"a": 2.0, "b": 2.0}


def test_the_per_cluster_guarantee_covers_its_share_first() -> None:
    # 2 per cluster + 4 across clusters: 3 held on a needs only 1 of the 4.
    owner = Owner(4.0, base=2.0, holdings={"a": Holding(held=3.0)}, head="b")
    assert split_guarantee(owner, AB) == {"a": 1.0, "b": 3.0}


def test_the_same_inputs_give_the_same_parts_in_any_dict_order() -> None:
    h1 = {"a": Holding(1.0), "b": Holding(1.0), "c": Holding(1.0)}
    h2 = dict(reversed(list(h1.items())))
    order = ["a", "b", "c"]
    assert split_guarantee(Owner(2.0, holdings=h1, head="c"), order) == \
        split_guarantee(Owner(2.0, holdings=h2, head="c"), order) == {"a": 1.0, "b": 1.0, "c": 0.0}


def test_a_cap_that_binds_moves_the_rest_on_and_the_sum_never_exceeds_it() -> None:
    parts = split_guarantee(Owner(4.0, head="a"), AB, cap={"a": 1.0, "b": 1.0})
    assert parts == {"a": 1.0, "b": 1.0}


def test_tenant_guarantee_caps_its_projects_parts_defect_2() -> None:
    # Tenant guaranteed 4 in all, two projects each guaranteed 4 in all; p1 holds 4 on a.
    # The first design let p2 count 4 on b too: 8 non-preemptible GPUs for a tenant of 4.
    p1 = Owner(4.0, holdings={"a": Holding(4.0, 4.0)}, head="a")
    p2 = Owner(4.0, head="b")
    tenant = Owner(4.0, holdings={"a": Holding(4.0, 4.0)}, head="b")
    tparts, pparts = split_tenant(AB, tenant, 0.0, {1: p1, 2: p2}, 0.0)
    assert tparts == {"a": 4.0, "b": 0.0}
    assert pparts[1] == {"a": 4.0, "b": 0.0}
    assert pparts[2] == {"a": 0.0, "b": 0.0}
    assert sum(pparts[1].values()) + sum(pparts[2].values()) <= 4.0


def test_projects_claim_what_they_hold_before_any_remainder() -> None:
    # Tenant 8 in all; p1 (id 1) holds nothing and heads on a; p2 holds 4 on a.
    # p1's remainder must not push p2's running work out of the tenant's room on a.
    tenant = Owner(8.0, holdings={"a": Holding(4.0)}, head="a")
    p1 = Owner(4.0, head="a")
    p2 = Owner(4.0, holdings={"a": Holding(4.0)}, head="a")
    tparts, pparts = split_tenant(AB, tenant, 0.0, {1: p1, 2: p2}, 0.0)
    assert tparts == {"a": 8.0, "b": 0.0}
    assert pparts[2]["a"] == 4.0
    assert pparts[1] == {"a": 4.0, "b": 0.0}


def test_a_tenant_guaranteeing_nothing_restricts_nothing() -> None:
    _, pparts = split_tenant(AB, None, 0.0, {1: Owner(4.0, head="b")}, 0.0)
    assert pparts[1] == {"a": 0.0, "b": 4.0}


def test_a_tenant_per_cluster_guarantee_already_given_to_projects_leaves_no_room() -> None:
    # Tenant guarantees 4 per cluster, its projects 4 per cluster already: nothing left.
    _, pparts = split_tenant(AB, None, 4.0, {1: Owner(4.0, head="b")}, 4.0)
    assert pparts[1] == {"a": 0.0, "b": 0.0}


@pytest.mark.parametrize("total", [0.0, 0.5, 3.0, 7.25])
def test_parts_sum_to_the_guarantee_when_nothing_caps_them(total: float) -> None:
    owner = Owner(total, base=0.5, holdings={"a": Holding(2.0, 1.0), "b": Holding(5.0)}, head="b")
    assert sum(split_guarantee(owner, AB).values()) == pytest.approx(total)


def test_the_remainder_stops_at_what_the_per_cluster_limit_lets_it_hold() -> None:
    # Review #2: 2 held on a, at most 2 per cluster: the rest (2) goes to b, not the head's a.
    owner = Owner(4.0, holdings={"a": Holding(2.0)}, head="a", limit={"a": 2.0, "b": 2.0})
    assert split_guarantee(owner, AB) == {"a": 2.0, "b": 2.0}


def test_the_remainder_goes_to_the_heads_clusters_in_their_order() -> None:
    abc = ["a", "b", "c"]
    assert split_guarantee(Owner(4.0, heads=("c", "b")), abc) == {"a": 0.0, "b": 0.0, "c": 4.0}
    capped = Owner(4.0, heads=("c", "b"), limit={"a": 4.0, "b": 4.0, "c": 1.0})
    assert split_guarantee(capped, abc) == {"a": 0.0, "b": 3.0, "c": 1.0}


def test_a_siblings_preemptible_borrowing_never_takes_a_guaranteed_projects_part() -> None:
    # Review #4: tenant and p1 guarantee 4 in all; p2 (no guarantee) borrows 4 on b,
    # preemptibly; p1 heads on a. The tenant's part goes where p1 needs it.
    tenant = Owner(4.0, holdings={"b": Holding(4.0)}, head="b")
    p1 = Owner(4.0, head="a")
    tparts, pparts = split_tenant(AB, tenant, 0.0, {1: p1}, 0.0)
    assert pparts[1] == {"a": 4.0, "b": 0.0}
    assert tparts == {"a": 4.0, "b": 0.0}


def test_the_tenants_non_preemptible_work_is_covered_before_its_projects_parts() -> None:
    # p2 (no guarantee) holds 2 non-preemptible on b: the tenant covers them first, p1 the rest.
    tenant = Owner(4.0, holdings={"b": Holding(2.0, 2.0)}, head="b")
    tparts, pparts = split_tenant(AB, tenant, 0.0, {1: Owner(4.0, head="a")}, 0.0)
    assert tparts == {"a": 2.0, "b": 2.0}
    assert pparts[1] == {"a": 2.0, "b": 0.0}
    for c in AB:
        assert pparts[1][c] <= tparts[c]
