"""The guarantee across all clusters turned into one cluster's queue-tree guarantee
(scheduling.selectors.effective_guarantees): pure, no database."""

from __future__ import annotations

from scheduling.selectors import AllClusterLimits, AllClusterUse, effective_guarantees

EAST, WEST = 1, 2
P1, P2, T = 11, 12, 7


def _use(*held: tuple[str, int, int, float]) -> AllClusterUse:
    use = AllClusterUse()
    for level, key, cluster, gpus in held:
        use.gpus[(level, key, cluster)] += gpus
    return use


def _limits(project: dict[int, float] | None = None,
            tenant: dict[int, float] | None = None) -> AllClusterLimits:
    return AllClusterLimits({}, {}, {p: T for p in (project or {})}, project_guarantee=project or {},
                            tenant_guarantee=tenant or {})


def test_the_guarantee_less_what_is_held_on_the_other_clusters() -> None:
    use = _use(("project", P1, WEST, 3.0), ("project", P1, EAST, 2.0))
    eff = effective_guarantees(EAST, _limits({P1: 8.0}), use, {}, {}, {T: [P1, P2]})
    assert eff[("project", P1)] == 5.0  # 8 − 3 held on west; east's own 2 do not count
    # A tenant guaranteeing nothing here restricts nothing and stays so (P2 is not bound).
    assert ("tenant", T) not in eff
    # One that guarantees something is raised to its projects' sum (the engine checks it).
    eff = effective_guarantees(EAST, _limits({P1: 8.0}), use, {("tenant", T): 1.0}, {}, {T: [P1, P2]})
    assert eff[("tenant", T)] == 5.0
    # Used up elsewhere: nothing across clusters, the per-cluster guarantee stays.
    use = _use(("project", P1, WEST, 9.0))
    eff = effective_guarantees(EAST, _limits({P1: 8.0}), use, {("project", P1): 2.0}, {}, {T: [P1]})
    assert eff[("project", P1)] == 2.0


def test_capped_by_the_per_cluster_limit_and_never_below_the_per_cluster_guarantee() -> None:
    eff = effective_guarantees(EAST, _limits({P1: 8.0}), _use(), {("project", P1): 1.0},
                               {("project", P1): 4.0}, {T: [P1]})
    assert eff[("project", P1)] == 4.0
    eff = effective_guarantees(EAST, _limits({P1: 2.0}), _use(), {("project", P1): 3.0}, {}, {T: [P1]})
    assert eff[("project", P1)] == 3.0


def test_a_tenant_guarantee_across_clusters_and_its_projects() -> None:
    use = _use(("tenant", T, WEST, 4.0), ("project", P2, WEST, 4.0))
    per_cluster = {("tenant", T): 1.0, ("project", P2): 1.0}
    eff = effective_guarantees(EAST, _limits({P1: 3.0}, {T: 10.0}), use, per_cluster, {}, {T: [P1, P2]})
    assert eff[("tenant", T)] == 6.0  # 10 − 4 held on west, above P1's 3 + P2's 1
    assert eff[("project", P1)] == 3.0 and ("project", P2) not in eff  # P2 keeps its own
