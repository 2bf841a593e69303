"""Preemption: which running jobs may be evicted for a pending one, and the smallest set to evict.

Rules (each function below states its own):

* eligibility — only preemptible jobs that have run their minimum runtime; a victim must have a
  lower priority than the preemptor, or be borrowing (from another queue) while the preemptor is
  within its guaranteed share (reclaim);
* preference — borrowing jobs first, then lowest priority, then most recently started, then
  checkpoint-capable;
* victim set — the fewest victims that let the preemptor fit (on the node needing fewest, for a
  one-pod job), and nobody at all when evicting every eligible job would still not be enough.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduling.engine.model import Job
from scheduling.engine.queueing import RunningJob
from scheduling.engine.state import ClusterState


@dataclass(frozen=True, slots=True)
class PreemptionConfig:
    """How preemption behaves."""

    enabled: bool = True
    min_runtime_s: float = 0.0
    """Never evict a job that has run less than this."""
    max_node_trials: int = 64
    """For one-pod preemptors, how many candidate nodes are compared for the fewest victims."""


def may_preempt(
    preemptor: Job,
    victim: RunningJob,
    *,
    now: float,
    reclaiming: bool,
    victim_borrowing: bool,
    min_runtime_s: float,
) -> bool:
    """Rule (eligibility): a running job may be evicted for ``preemptor`` iff it is preemptible,
    has run at least ``min_runtime_s``, and either has a lower priority than the preemptor, or is
    borrowing capacity from another queue while the preemptor is within its guaranteed share."""
    if not victim.preemptible:
        return False
    if victim.start_time is not None and now - victim.start_time < min_runtime_s:
        return False
    if victim.priority < preemptor.priority:
        return True
    return reclaiming and victim_borrowing and victim.queue != preemptor.queue


def victim_key(victim: RunningJob, borrowing: bool) -> tuple[int, int, float, int, str]:
    """Rule (preference): borrowing jobs first, then lowest priority, then most recently started,
    then checkpoint-capable (their work is not lost)."""
    return (
        0 if borrowing else 1,
        victim.priority,
        -(victim.start_time or 0.0),
        0 if victim.checkpointable else 1,
        victim.name,
    )


class Evictor:
    """Removes and restores running jobs' pods on a :class:`ClusterState` (for trials)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def remove(self, job: RunningJob) -> None:
        """Release the job's pods."""
        for pp in job.pods:
            self.state.unreserve(pp)

    def restore(self, job: RunningJob) -> None:
        """Reserve the job's pods again."""
        for pp in job.pods:
            self.state.reserve(pp, check=False)


def smallest_prefix(
    evictor: Evictor, items: Sequence[RunningJob], fits: Callable[[], bool]
) -> int | None:
    """The shortest prefix of ``items`` whose removal makes ``fits()`` true (binary search; every
    item is restored before returning), or None when removing them all is not enough."""
    for it in items:
        evictor.remove(it)
    ok = fits()
    for it in reversed(items):
        evictor.restore(it)
    if not ok:
        return None
    lo, hi = 1, len(items)
    removed = 0
    while lo < hi:
        mid = (lo + hi) // 2
        while removed < mid:
            evictor.remove(items[removed])
            removed += 1
        while removed > mid:
            removed -= 1
            evictor.restore(items[removed])
        if fits():
            hi = mid
        else:
            lo = mid + 1
    while removed > 0:
        removed -= 1
        evictor.restore(items[removed])
    return lo


def minimal_victims(
    evictor: Evictor, ordered: Sequence[RunningJob], fits: Callable[[], bool]
) -> list[RunningJob] | None:
    """Rule (victim set): evict in preference order the shortest prefix that makes the preemptor
    fit, then give back every victim (last chosen first) whose eviction turns out unnecessary.
    Nobody is evicted when even all of ``ordered`` would not make room. On success the victims
    stay removed from the state."""
    k = smallest_prefix(evictor, ordered, fits)
    if k is None:
        return None
    chosen = list(ordered[:k])
    for v in chosen:
        evictor.remove(v)
    if not fits():  # non-monotone corner: fall back to all eligible jobs
        for v in ordered[k:]:
            evictor.remove(v)
        chosen = list(ordered)
    kept: set[str] = set()
    for v in reversed(chosen):
        evictor.restore(v)
        if fits():
            continue
        evictor.remove(v)
        kept.add(v.name)
    return [v for v in chosen if v.name in kept]


def fewest_victims_one_pod(
    evictor: Evictor,
    ordered: Sequence[RunningJob],
    nodes_of: Callable[[RunningJob], set[str]],
    fits_on: Callable[[str], bool],
    max_nodes: int,
    could_fit: Callable[[str, list[RunningJob]], bool] | None = None,
) -> list[RunningJob] | None:
    """Rule (victim set, one pod): for each node holding eligible jobs, the minimal victims that let
    the pod fit there; choose the node needing the fewest, then the most preferred victims
    (compared in preference order). On success the victims stay removed from the state.

    ``could_fit(node, victims)``, when given, is a cheap necessary condition (would the pod fit
    with all of them gone?); nodes failing it are skipped without trials and do not count
    towards ``max_nodes``."""
    per_node: dict[str, list[RunningJob]] = {}
    for v in ordered:
        for n in sorted(nodes_of(v)):
            per_node.setdefault(n, []).append(v)
    best: list[RunningJob] | None = None
    best_key: tuple[int, list[int]] | None = None
    rank = {v.name: i for i, v in enumerate(ordered)}
    nodes = list(per_node)
    if could_fit is not None:
        nodes = [n for n in nodes if could_fit(n, per_node[n])]
    for n in nodes[:max_nodes]:
        if best_key is not None and best_key[0] == 1 and rank[per_node[n][0].name] > best_key[1][0]:
            break  # nodes come in order of their most preferred victim: none can do better
        vs = minimal_victims(evictor, per_node[n], lambda n=n: fits_on(n))  # type: ignore[misc]
        if vs is None:
            continue
        for v in vs:
            evictor.restore(v)
        key = (len(vs), sorted(rank[v.name] for v in vs))
        if best_key is None or key < best_key:
            best, best_key = vs, key
            if len(vs) == 1 and key[1][0] == 0:
                break
    if best is None:
        return None
    for v in best:
        evictor.remove(v)
    return best
