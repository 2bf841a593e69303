"""A GPU guarantee across all clusters split into per-cluster parts (issue 16, the queue tree's
platform level). Pure: no database, no Django.

A tenant or project quota may guarantee G GPUs over every cluster together, beside its
per-cluster guarantee ``base`` (which applies on each cluster alike). Each cluster's cycle
judges with one queue tree, so G is split into parts, one per cluster, that SUM TO G (never
more: a guarantee counted whole on every cluster at once let two cycles each reclaim G, 2 × G
evicted for a guarantee of G). On cluster c the engine then sees ``base + part[c]`` as the
guarantee. The parts are computed in a fixed, deterministic order, so two cycles that read the
same rows compute the same parts:

1. what the owner's non-preemptible jobs hold beyond ``base`` on each cluster (they must stay
   within a guarantee, so they are covered first), clusters in the given order;
2. what its other jobs hold beyond ``base`` there, a waiting preemptor's ask counted as held
   (the GPUs it is evicting for are the guarantee it relies on), same order;
3. the remainder to the clusters where the owner's queued jobs that could run wait (``head``,
   ``heads``: best job first), then the rest of the order; on each cluster at most what the
   owner's per-cluster limit lets it hold (``limit``), the rest moving on.

Each step takes at most what is left of G, and, when a ``cap`` is given, at most what the
cap leaves on that cluster: a project's parts are capped by what its tenant has left there
(:func:`split_tenant`, where the tenant's part grows for its guaranteed projects before its
other projects' preemptible work claims it), so a project never holds more guaranteed GPUs on
a cluster than its tenant's guarantee there covers. When a cap binds, the parts sum to less
than G.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

EPS = 1e-9



def nonpreemptible_refusal(held: float, ask: float, guarantee: float, ever: float | None = None) -> str:
    """Rule (non-preemptible within guarantee) — its one definition (issue 29); the engine's
    queue tree, the cycle's check across clusters, the placement step's probe and the submit
    form's refusal all ask it. A non-preemptible job starts only while what its owner's
    non-preemptible jobs hold (``held``) + its ``ask`` stays within the ``guarantee``; beyond,
    it waits (``"waits"``): capacity it would hold beyond a guarantee could not be reclaimed.
    Asking more than the most the guarantee could ever give (``ever``, default ``guarantee``)
    it can never start (``"never"``). ``""`` when within. The callers choose the levels that
    have a guarantee at all (a level guaranteeing nothing restricts nothing) and the unit
    (GPUs of the accounting module, or the queue tree's resources)."""
    if ask > (guarantee if ever is None else ever) + EPS:
        return "never"
    if held + ask > guarantee + EPS:
        return "waits"
    return ""


def beyond_words(what: str = "GPUs") -> str:
    """Why the rule holds, in the words every reason of it ends with: a fact, never an action
    (issue 29: a reason suggests nothing, so it suggests nothing a page cannot do; what would
    let a job start is the page's hint for its kind, ``workspaces.selectors.job_why``)."""
    return f"non-preemptible work does not borrow idle {what} beyond a guarantee (it could not be reclaimed)"


K = TypeVar("K", bound=Hashable)
"""A cluster's key (its id in the services, any hashable in tests)."""


@dataclass(frozen=True)
class Holding:
    """What an owner (a project or a tenant) holds on one cluster, in GPUs."""

    held: float = 0.0
    """GPUs held by all its jobs there, plus the asks of its preemptors waiting there."""
    nonpreemptible: float = 0.0
    """Of which GPUs held by non-preemptible jobs."""


@dataclass(frozen=True)
class Owner(Generic[K]):
    """One owner's inputs: its guarantee across all clusters (``total``), its per-cluster
    guarantee (``base``), what it holds per cluster, and the cluster of its head job."""

    total: float
    base: float = 0.0
    holdings: Mapping[K, Holding] = field(default_factory=dict)
    head: K | None = None
    heads: Sequence[K] = ()
    """The clusters where its queued jobs that could run wait, best job first (``head``,
    when given, goes before them)."""
    limit: Mapping[K, float] | None = None
    """Its per-cluster GPU limit less its per-cluster guarantee, per cluster (None: no
    limit): a part above it could never be held there, so the remainder stops there."""


def _room(cap: Mapping[K, float] | None, used: Mapping[K, float], c: K) -> float:
    if cap is None:
        return float("inf")
    return max(0.0, cap.get(c, 0.0) - used.get(c, 0.0))


class _Grow(Generic[K]):
    """The room a tenant's guarantee leaves its projects' parts on each cluster: what it
    guarantees there already (``cap``: per-cluster guarantee + its part so far, less its
    projects' per-cluster guarantees) less what they took, plus what is left of its guarantee
    across all clusters (``spare``), which grows its part there as they take it."""

    def __init__(self, cap: Mapping[K, float] | None, spare: float = 0.0,
                 tparts: dict[K, float] | None = None) -> None:
        self.cap = None if cap is None else dict(cap)
        self.spare, self.tparts = spare, tparts
        self.taken: dict[K, float] = {}

    def room(self, c: K) -> float:
        if self.cap is None:
            return float("inf")
        return max(0.0, self.cap.get(c, 0.0) - self.taken.get(c, 0.0)) + self.spare

    def take(self, c: K, x: float) -> None:
        if self.cap is not None:
            fixed = max(0.0, self.cap.get(c, 0.0) - self.taken.get(c, 0.0))
            extra = min(self.spare, max(0.0, x - fixed))
            if extra > 0 and self.tparts is not None:
                self.tparts[c] += extra
                self.cap[c] = self.cap.get(c, 0.0) + extra
                self.spare -= extra
        self.taken[c] = self.taken.get(c, 0.0) + x


def claim_held(owner: Owner[K], clusters: Sequence[K], cap: Mapping[K, float] | None = None,
               taken: dict[K, float] | None = None, grow: _Grow[K] | None = None) -> dict[K, float]:
    """Steps 1 and 2 (see the module's docstring): the parts that cover what ``owner`` holds
    beyond its per-cluster guarantee. ``taken``: what other owners sharing ``cap`` took
    already (increased by this owner's parts); ``grow`` instead of both: a tenant's room that
    grows its part (``split_tenant``)."""
    parts = {c: 0.0 for c in clusters}
    taken = {} if taken is None else taken
    left = max(0.0, owner.total)
    for pick in (lambda h: h.nonpreemptible, lambda h: h.held):
        for c in clusters:
            if left <= EPS:
                break
            want = max(0.0, pick(owner.holdings.get(c, Holding())) - owner.base) - parts[c]
            left -= _give(parts, c, min(max(0.0, want), left), cap, taken, grow)
    return parts


def _give(parts: dict[K, float], c: K, want: float, cap: Mapping[K, float] | None,
          taken: dict[K, float], grow: _Grow[K] | None) -> float:
    """Add to ``parts[c]`` up to ``want``, within the room ``cap``/``taken`` (or ``grow``)
    leaves on ``c``; record what was taken and return it."""
    got = min(want, _room(cap, taken, c) if grow is None else grow.room(c))
    if got <= 0:
        return 0.0
    parts[c] += got
    if grow is None:
        taken[c] = taken.get(c, 0.0) + got
    else:
        grow.take(c, got)
    return got


def place_rest(owner: Owner[K], parts: dict[K, float], clusters: Sequence[K],
               cap: Mapping[K, float] | None = None, taken: dict[K, float] | None = None,
               grow: _Grow[K] | None = None) -> dict[K, float]:
    """Step 3: what is left of the guarantee to the clusters of the head jobs (``head``, then
    ``heads``), then to the rest of the order; on each cluster at most what the owner's
    per-cluster limit leaves (``limit``) and what ``cap`` leaves."""
    taken = {} if taken is None else taken
    left = max(0.0, owner.total) - sum(parts.values())
    order = list(dict.fromkeys([*([owner.head] if owner.head is not None else []), *owner.heads,
                                *clusters]))
    for c in order:
        if left <= EPS:
            break
        if c not in parts:
            continue
        lim = float("inf") if owner.limit is None else max(0.0, owner.limit.get(c, 0.0) - parts[c])
        left -= _give(parts, c, min(left, lim), cap, taken, grow)
    return parts


def split_guarantee(owner: Owner[K], clusters: Sequence[K],
                    cap: Mapping[K, float] | None = None) -> dict[K, float]:
    """One owner's parts, cluster → GPUs, summing to its guarantee across all clusters (less
    only where ``cap`` binds). ``clusters``: the fixed order (every open cluster)."""
    taken: dict[K, float] = {}
    return place_rest(owner, claim_held(owner, clusters, cap, taken), clusters, cap, taken)


def split_tenant(clusters: Sequence[K], tenant: Owner[K] | None, tenant_base: float,
                 projects: Mapping[int, Owner[K]], project_bases: float,
                 ) -> tuple[dict[K, float] | None, dict[int, dict[K, float]]]:
    """The parts of a tenant's guarantee across all clusters and of its projects'.

    ``tenant``: the tenant's own guarantee across all clusters (None: it has none);
    ``tenant_base``: its per-cluster GPU guarantee; ``projects``: project id → the projects
    that have a guarantee across all clusters; ``project_bases``: the per-cluster GPU
    guarantees of all its projects together (already promised inside the tenant's).

    Rule (a project's part within its tenant's): when the tenant guarantees anything (its
    per-cluster guarantee or one across all clusters), the projects' parts on a cluster
    together stay within what the tenant guarantees there (``tenant_base`` + the tenant's
    part) less the projects' per-cluster guarantees. The tenant's parts are claimed in this
    order: what its non-preemptible jobs hold beyond its per-cluster guarantee (they must stay
    within it); then its guaranteed projects' parts, which grow the tenant's part on their
    cluster as they need it (what they hold first, all of them, by id; then their remainders,
    by id, so one project's remainder never displaces another's running work); then what the
    tenant's other (preemptible) work holds; then the tenant's own remainder. So another
    project's preemptible borrowing never takes the tenant's part a guaranteed project needs.
    A tenant guaranteeing nothing at all restricts nothing (as the engine's guarantee rule: a
    level guaranteeing 0 does not restrict)."""
    tparts: dict[K, float] | None = None
    grow: _Grow[K]
    if tenant is not None:
        tparts = {c: 0.0 for c in clusters}
        left = max(0.0, tenant.total)
        for c in clusters:
            got = min(left, max(0.0, tenant.holdings.get(c, Holding()).nonpreemptible - tenant_base))
            if got > 0:
                tparts[c] += got
                left -= got
        # Of its non-preemptible work, the part its other projects hold beyond their own
        # per-cluster guarantees is the tenant's to cover, not its guaranteed projects' room.
        gbases = sum(o.base for o in projects.values())
        others = {c: max(0.0, tenant.holdings.get(c, Holding()).nonpreemptible
                         - sum(o.holdings.get(c, Holding()).nonpreemptible for o in projects.values())
                         - max(0.0, project_bases - gbases)) for c in clusters}
        grow = _Grow({c: max(0.0, tenant_base + tparts[c] - project_bases - others[c]) for c in clusters},
                     left, tparts)
    elif tenant_base > 0:
        grow = _Grow({c: max(0.0, tenant_base - project_bases) for c in clusters})
    else:
        grow = _Grow(None)
    out = {pid: claim_held(o, clusters, grow=grow) for pid, o in sorted(projects.items())}
    for pid, o in sorted(projects.items()):
        place_rest(o, out[pid], clusters, grow=grow)
    if tenant is not None and tparts is not None:
        left = max(0.0, tenant.total) - sum(tparts.values())
        for c in clusters:
            if left <= EPS:
                break
            got = min(left, max(0.0, tenant.holdings.get(c, Holding()).held - tenant_base - tparts[c]))
            if got > 0:
                tparts[c] += got
                left -= got
        place_rest(tenant, tparts, clusters)
    return tparts, out
