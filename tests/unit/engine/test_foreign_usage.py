"""GPUs held by pods another scheduler placed (issue 11): a card starts the cycle with their
memory, cores and sharer slots in use (or wholly taken), Camp places around them, a waiting
job's reason names them, preemption never counts on them and "never fits" ignores them."""

from __future__ import annotations

import dataclasses

from scheduling.engine import Admit, Job, JobAffinity, Placer, PodGroup, Reject, Wait, pod, schedule
from scheduling.engine.model import GpuDevice, Node
from scheduling.engine.queueing import Quota
from scheduling.engine.state import ClusterState
from tests.unit.engine.builders import cluster, job, node
from tests.unit.queueing.builders import cycle, gjob, running, tree


def held(n: Node, index: int, **foreign: object) -> Node:
    """``n`` with card ``index`` partly or wholly held by another scheduler's pod."""
    gpus = list(n.gpus)
    gpus[index] = dataclasses.replace(gpus[index], **foreign)  # type: ignore[arg-type]
    return dataclasses.replace(n, gpus=tuple(gpus))


HAMI_POD = {"foreign_memory_mib": 36_000, "foreign_cores_percent": 20, "foreign_sharers": 1}
SLICE = pod("p", gpu_count=1, gpu_memory_mib=20_000, gpu_cores_percent=30)


def test_a_slice_goes_to_the_card_other_pods_leave_room_on() -> None:
    # Card 0 has 35 GiB of its 40 taken by a HAMi pod Camp did not create: the slice goes to card 1.
    snap = cluster(held(node("a", 2), 0, **HAMI_POD))
    p = Placer(ClusterState(snap)).find(SLICE)
    assert p is not None and p.gpus[0].index == 1


def test_foreign_cores_and_sharer_slots_count_too() -> None:
    by_cores = cluster(held(node("a", 1), 0, foreign_memory_mib=1_000, foreign_cores_percent=80,
                             foreign_sharers=1))
    by_slots = cluster(held(node("a", 1, max_sharers=2), 0, foreign_memory_mib=1_000, foreign_sharers=2))
    for snap in (by_cores, by_slots):
        assert Placer(ClusterState(snap)).find(SLICE) is None
    # Without them the same card takes it.
    assert Placer(ClusterState(cluster(node("a", 1)))).find(SLICE) is not None


def test_a_whole_card_held_by_a_default_scheduler_pod_takes_nothing() -> None:
    snap = cluster(held(node("a", 2), 1, foreign_exclusive=True))
    [d] = schedule(snap, [job("j", pod("p", gpu_count=2))])
    assert isinstance(d, Wait)  # not Reject: the node could hold it once the other pod ends
    [d] = schedule(snap, [job("j", pod("p", gpu_count=1))])
    assert isinstance(d, Admit) and d.placement.pods[0].gpus[0].index == 0
    # A shared slice does not fit on a foreign whole card either.
    snap = cluster(held(node("a", 1), 0, foreign_exclusive=True))
    assert Placer(ClusterState(snap)).find(SLICE) is None


def test_a_job_too_large_only_because_of_foreign_pods_waits_not_rejected() -> None:
    full = held(held(node("a", 2), 0, foreign_exclusive=True), 1, foreign_exclusive=True)
    [d] = schedule(cluster(full), [job("j", pod("p", gpu_count=2), affinity=JobAffinity.SAME_NODE)])
    assert isinstance(d, Wait), d
    [d] = schedule(cluster(full), [job("j", pod("p", gpu_count=3))])
    assert isinstance(d, Reject)  # larger than the node itself: never




def test_the_waiting_reason_names_the_cause() -> None:
    snap = cluster(held(node("a", 1), 0, **HAMI_POD))
    result = cycle(snap, [_slice_job()], tree({"t": {"p": Quota()}}))
    status = result.statuses["j"]
    assert isinstance(status.decision, Wait)
    assert "1 GPU that would fit is held by pods Camp did not create" in status.decision.reason, (
        status.decision.reason)
    # Where nothing foreign is in the way, no such words.
    other = cycle(cluster(node("a", 1)), [_slice_job(), dataclasses.replace(_slice_job(), name="k")],
                  tree({"t": {"p": Quota()}}))
    assert all("did not create" not in s.decision.reason for s in other.statuses.values()
               if isinstance(s.decision, Wait))


def _slice_job() -> Job:
    tpl = pod("x", gpu_count=1, gpu_memory_mib=30_000, gpu_cores_percent=50)
    return Job(name="j", groups=(PodGroup("w", tpl, 1),), queue="t/p")


def test_preemption_never_counts_on_a_foreign_card() -> None:
    # Card 0: Camp's low-priority job; card 1: another scheduler's pod. A 2-card job cannot get
    # both by preempting, so nothing is evicted for it.
    snap = cluster(held(node("a", 2), 1, foreign_exclusive=True))
    victim = running("low", "a", (0,), priority=0)
    result = cycle(snap, [gjob("high", 2, priority=100)], tree({"t": {"p": Quota()}}), run=[victim])
    assert not result.evicted
    assert isinstance(result.statuses["high"].decision, Wait)
    # The same cluster without the other scheduler's pod: the low-priority job is preempted.
    result = cycle(cluster(node("a", 2)), [gjob("high", 2, priority=100)], tree({"t": {"p": Quota()}}),
                   run=[victim])
    assert result.evicted == ("low",)


def test_gpu_device_foreign_flag() -> None:
    assert not GpuDevice(0, "u", "A100", 1).foreign
    assert GpuDevice(0, "u", "A100", 1, foreign_sharers=1).foreign


def test_a_distinct_nodes_job_is_not_rejected_because_of_foreign_pods() -> None:
    """The queue cycle's "could this node ever host it" ignores other schedulers' pods like the
    placer's never-fits: two workers on distinct nodes wait while one node's only card is held
    by a default-scheduler pod; they are not rejected as "no node set can ever fit"."""
    snap = cluster(node("a", 1), held(node("b", 1), 0, foreign_exclusive=True))
    two = Job(name="two", groups=(PodGroup("w", pod("w", gpu_count=1), 2),), queue="t/p",
              affinity=JobAffinity.DISTINCT_NODES)
    result = cycle(snap, [two], tree({"t": {"p": Quota()}}))
    assert isinstance(result.statuses["two"].decision, Wait), result.statuses["two"].decision


def test_the_cycle_rejects_a_same_node_job_no_node_could_ever_hold() -> None:
    """r4sng: the queue cycle applies the placer's same-node rule: two whole-card pods on nodes
    of one card each fit the cluster but never one node, so the job is rejected with the
    reason instead of waiting for ever (holding nodes for its gang); on a two-card node it runs."""
    def same_node() -> Job:
        return Job(name="pair", groups=(PodGroup("w", pod("w", gpu_count=1), 2),), queue="t/p",
                   affinity=JobAffinity.SAME_NODE)

    result = cycle(cluster(node("a", 1), node("b", 1)), [same_node()], tree({"t": {"p": Quota()}}))
    decision = result.statuses["pair"].decision
    assert isinstance(decision, Reject) and "even when empty" in decision.reason, decision
    result = cycle(cluster(node("a", 1), node("b", 2)), [same_node()], tree({"t": {"p": Quota()}}))
    decision = result.statuses["pair"].decision
    assert isinstance(decision, Admit) and set(decision.placement.nodes()) == {"b"}, decision
