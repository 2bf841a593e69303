"""One job's pods never mix GPU models unless the job allows it (issue 11)."""

from __future__ import annotations

import dataclasses

from scheduling.engine import Admit, Job, PodGroup, Reject, Wait, pod, schedule
from scheduling.engine.cycle import CycleConfig
from scheduling.engine.queueing import Quota
from tests.unit.engine.builders import cluster, job, node
from tests.unit.queueing.builders import cycle, tree

WORKER = pod("w", gpu_count=1)


def _models(d: object) -> set[str]:
    assert isinstance(d, Admit), d
    return {g.gpu_model for pp in d.placement.pods for g in pp.gpus}


def test_a_gang_with_no_model_constraint_stays_on_one_model() -> None:
    # 2 A100 + 2 H100: four workers fit only by mixing, never on one model, so the job is
    # rejected with a reason that names the way out...
    snap = cluster(node("a", 2, model="A100"), node("h", 2, model="H100"))
    [d] = schedule(snap, [job("j", WORKER, replicas=4)])
    assert isinstance(d, Reject), d
    assert "mixed_gpu_models" in d.reason and "A100: 2" in d.reason, d.reason
    # ...unless it allows mixing.
    mixed = dataclasses.replace(job("j", WORKER, replicas=4), mixed_gpu_models=True)
    [d] = schedule(snap, [mixed])
    assert _models(d) == {"A100", "H100"}


def test_the_job_goes_to_the_model_that_can_hold_all_of_it() -> None:
    # The placer's favourite for one pod is the emptier node (3 H100), yet only the A100s can
    # hold all four workers.
    snap = cluster(node("a1", 2, model="A100"), node("a2", 2, model="A100"), node("h", 3, model="H100"))
    [d] = schedule(snap, [job("j", WORKER, replicas=4)])
    assert _models(d) == {"A100"}
    [d] = schedule(snap, [job("j", WORKER, replicas=2)])
    assert len(_models(d)) == 1


def test_one_pod_with_several_gpus_on_a_mixed_node_gets_one_model() -> None:
    mixed_node = dataclasses.replace(
        node("m", 4), gpus=tuple(dataclasses.replace(g, model="A100" if g.index < 2 else "V100")
                                 for g in node("m", 4).gpus))
    [d] = schedule(cluster(mixed_node), [job("j", pod("p", gpu_count=2))])
    assert len(_models(d)) == 1
    # Three cards of one model exist nowhere: never, not "later".
    [d] = schedule(cluster(mixed_node), [job("j", pod("p", gpu_count=3))])
    assert isinstance(d, Reject) and "mixed_gpu_models" in d.reason, d


def test_groups_naming_different_models_get_them() -> None:
    """A job whose groups ask different models itself has allowed the mix."""
    snap = cluster(node("a", 2, model="A100"), node("t", 2, model="T4"))
    j = Job(name="j", groups=(PodGroup("ps", pod("ps", gpu_count=1, gpu_models=("T4",)), 1),
                              PodGroup("w", pod("w", gpu_count=1, gpu_models=("A100",)), 2)))
    [d] = schedule(snap, [j])
    assert _models(d) == {"A100", "T4"}


def test_a_pool_suffix_is_the_same_model() -> None:
    """Cards of a dedicated pool appear as ``model@pool``: the same physical model."""
    snap = cluster(node("a", 2, model="A100"), node("p", 2, model="A100@train"))
    [d] = schedule(snap, [job("j", WORKER, replicas=4)])
    assert _models(d) == {"A100", "A100@train"}


def test_the_queue_cycle_applies_the_rule_too() -> None:
    snap = cluster(node("a", 2, model="A100"), node("h", 2, model="H100"))
    four = Job(name="j", groups=(PodGroup("w", WORKER, 4),), queue="t/p")
    result = cycle(snap, [four], tree({"t": {"p": Quota()}}))
    assert isinstance(result.statuses["j"].decision, Reject)
    assert "mixed_gpu_models" in result.statuses["j"].decision.reason
    result = cycle(snap, [dataclasses.replace(four, mixed_gpu_models=True)], tree({"t": {"p": Quota()}}))
    assert _models(result.statuses["j"].decision) == {"A100", "H100"}
    two = Job(name="k", groups=(PodGroup("w", WORKER, 2),), queue="t/p")
    result = cycle(snap, [two, dataclasses.replace(two, name="l")], tree({"t": {"p": Quota()}}))
    for s in result.statuses.values():
        assert len(_models(s.decision)) == 1


def test_a_job_no_single_model_can_hold_neither_waits_nor_holds_nodes() -> None:
    """A gang that can never run on one model is rejected at once: it does not wait forever
    holding nodes of every model (backfill) and blocking other tenants on an idle cluster."""
    snap = cluster(node("a", 2, model="A100"), node("h", 2, model="H100"))
    strict = Job(name="strict", groups=(PodGroup("w", WORKER, 4),), queue="t/p", submit_time=0.0)
    small = Job(name="small", groups=(PodGroup("w", WORKER, 1),), queue="u/q", submit_time=1.0)
    result = cycle(snap, [strict, small], tree({"t": {"p": Quota()}, "u": {"q": Quota()}}))
    assert isinstance(result.statuses["strict"].decision, Reject)
    assert isinstance(result.statuses["small"].decision, Admit), result.statuses["small"].decision
    # The same shape allowed to mix is not rejected by the verdict memo of the strict one.
    mixed = dataclasses.replace(strict, name="mixed", mixed_gpu_models=True, submit_time=2.0)
    result = cycle(snap, [strict, mixed], tree({"t": {"p": Quota()}}))
    assert isinstance(result.statuses["mixed"].decision, Admit), result.statuses["mixed"].decision


def test_a_waiting_one_model_gang_holds_nodes_of_one_model_only() -> None:
    """Backfill: a gang that fits on the A100s once they are free holds A100 nodes, never the
    H100 node it may not combine with them, so a smaller job queued behind it still starts there."""
    snap = cluster(node("a1", 2, model="A100"), node("a2", 2, model="A100"), node("h", 2, model="H100"))
    hog = Job(name="hog", groups=(PodGroup("w", WORKER, 1),), queue="t/p", submit_time=0.0)
    big = Job(name="big", groups=(PodGroup("w", WORKER, 4),), queue="t/p", submit_time=1.0)
    small = Job(name="small", groups=(PodGroup("w", pod("s", gpu_count=2), 1),), queue="t/p",
                submit_time=2.0)
    result = cycle(snap, [hog, big, small], tree({"t": {"p": Quota()}}))
    assert isinstance(result.statuses["hog"].decision, Admit)
    assert isinstance(result.statuses["big"].decision, Wait)
    d = result.statuses["small"].decision
    assert _models(d) == {"H100"}, d


def test_a_mixing_job_is_not_held_back_by_a_strict_job_of_the_same_shape() -> None:
    """The cycle remembers shapes that failed on this state; a job allowed to mix models is
    another shape than a strict one with the same pods, so it still starts."""
    snap = cluster(node("a1", 2, model="A100"), node("a2", 2, model="A100"), node("h", 2, model="H100"))
    hog = Job(name="hog", groups=(PodGroup("w", pod("h", gpu_count=2, gpu_models=("A100",)), 1),
                                  PodGroup("x", pod("x", gpu_count=1, gpu_models=("A100",)), 1)),
              queue="t/p", submit_time=0.0, mixed_gpu_models=True)
    strict = Job(name="strict", groups=(PodGroup("w", WORKER, 3),), queue="t/p", submit_time=1.0)
    mixed = dataclasses.replace(strict, name="mixed", mixed_gpu_models=True, submit_time=2.0)
    result = cycle(snap, [hog, strict, mixed], tree({"t": {"p": Quota()}}),
                   config=CycleConfig(backfill=False))
    assert isinstance(result.statuses["hog"].decision, Admit)
    # 1 A100 + 2 H100 free: three workers of one model do not fit now (4 A100 exist: it waits)...
    assert isinstance(result.statuses["strict"].decision, Wait), result.statuses["strict"].decision
    # ...but three workers that may mix do.
    assert _models(result.statuses["mixed"].decision) == {"A100", "H100"}
