"""Card-level search: which GPUs of one node could host a pod.

A *take* lists, for every GPU of every container, ``(container, gpu index, demand)``. Cards in the
same state, NUMA node and NVLink island are interchangeable, so the search enumerates multisets of
such equivalence classes instead of raw index combinations (symmetry pruning) and stops after
``max_takes`` candidates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from scheduling.engine.model import PodPlacement, PodRequest
from scheduling.engine.state import Demand, NodeState, align_demand

Take = tuple[tuple[int, int, Demand], ...]

MAX_TAKES = 64


class _Work:
    """A scratch copy of a node's GPU usage, so that several containers can be fitted in turn."""

    __slots__ = ("ns", "mem", "cores", "sharers", "excl")

    def __init__(self, ns: NodeState) -> None:
        self.ns = ns
        self.mem = list(ns.mem_used)
        self.cores = list(ns.cores_used)
        self.sharers = list(ns.sharers)
        self.excl = list(ns.exclusive)

    def fits(self, i: int, d: Demand) -> bool:
        gs = self.ns.static.gpus[i]
        if not gs.device.healthy or self.excl[i]:
            return False
        if d.exclusive:
            return self.sharers[i] == 0
        return (
            self.sharers[i] < gs.device.max_sharers
            and self.mem[i] + d.gpu_memory_mib <= gs.memory_capacity_mib
            and self.cores[i] + d.gpu_cores_percent <= gs.cores_capacity
        )

    def apply(self, i: int, d: Demand, sign: int) -> None:
        gs = self.ns.static.gpus[i]
        self.sharers[i] += sign
        if d.exclusive:
            self.excl[i] = sign > 0
            self.mem[i] += sign * gs.memory_capacity_mib
            self.cores[i] += sign * gs.cores_capacity
        else:
            self.mem[i] += sign * d.gpu_memory_mib
            self.cores[i] += sign * d.gpu_cores_percent


def container_demands(ns: NodeState, pod: PodRequest) -> tuple[tuple[Demand | None, ...], ...]:
    """Rule (model filter): per container and card, the aligned slice, or None where the card's
    model is not allowed, is excluded, or the slice can never fit that card.

    Cached per node class and pod shape (the answer depends on nothing else)."""
    static = ns.static
    key = (pod.containers, pod.gpu_models, pod.excluded_gpu_models)
    hit = static.demands.get(key)
    if hit is not None:
        return hit
    out = tuple(
        tuple(
            align_demand(gs.device, c) if pod.allows_model(gs.device.model) else None
            for gs in static.gpus
        )
        for c in pod.containers
    )
    static.demands[key] = out
    return out


def enough_cards(ns: NodeState, pod: PodRequest, demands: tuple[tuple[Demand | None, ...], ...]) -> bool:
    """Necessary condition (quick reject): each container alone finds ``gpu_count`` cards that
    take its slice in the node's current state."""
    gpu_fits = ns.gpu_fits
    for c, row in zip(pod.containers, demands, strict=True):
        k = c.gpu_count
        n = 0
        for i, d in enumerate(row):
            if d is not None and gpu_fits(i, d):
                n += 1
                if n >= k:
                    break
        if n < k:
            return False
    return True


def _multisets(sizes: list[int], k: int, start: int = 0) -> Iterator[list[int]]:
    """All ways to draw ``k`` items from classes of these sizes, most from early classes first."""
    if k == 0:
        yield [0] * (len(sizes) - start)
        return
    if start >= len(sizes):
        return
    rest = sum(sizes[start + 1 :])
    for n in range(min(k, sizes[start]), -1, -1):
        if k - n > rest:
            break
        for tail in _multisets(sizes, k - n, start + 1):
            yield [n, *tail]


def _in_one_domain(ns: NodeState, idx: list[int]) -> bool:
    gpus = ns.static.gpus
    if ns.static.node.topology.nvlink_islands:
        isl = {gpus[i].island for i in idx}
        return len(isl) == 1 and -1 not in isl
    return len({gpus[i].device.numa_node for i in idx}) == 1


def enumerate_takes(
    ns: NodeState,
    pod: PodRequest,
    *,
    strict_topology: bool = False,
    max_takes: int = MAX_TAKES,
) -> list[Take]:
    """Rule (card search): every distinct way, up to symmetry, to give each container
    ``gpu_count`` distinct cards that fit its slice; with ``strict_topology`` a multi-GPU container
    must stay inside one NVLink island (or one NUMA node when the node declares no islands)."""
    if not pod.containers:
        return [()]
    demands = container_demands(ns, pod)
    if not enough_cards(ns, pod, demands):
        return []
    work = _Work(ns)
    out: list[Take] = []
    chosen: list[tuple[int, int, Demand]] = []
    gpus = ns.static.gpus

    def rec(c: int) -> None:
        if len(out) >= max_takes:
            return
        if c == len(pod.containers):
            out.append(tuple(chosen))
            return
        k = pod.containers[c].gpu_count
        row = demands[c]
        classes: dict[tuple[object, ...], list[int]] = {}
        for i, d in enumerate(row):
            if d is None or not work.fits(i, d):
                continue
            gs = gpus[i]
            key = (
                work.mem[i],
                work.cores[i],
                work.sharers[i],
                gs.device.numa_node,
                gs.island,
                gs.memory_capacity_mib,
                gs.cores_capacity,
                gs.device.model,
                gs.device.utilization_percent,
                d,
            )
            classes.setdefault(key, []).append(i)
        members = list(classes.values())
        if sum(len(m) for m in members) < k:
            return
        for counts in _multisets([len(m) for m in members], k):
            idx = [i for m, n in zip(members, counts, strict=True) for i in m[:n]]
            if strict_topology and k > 1 and not _in_one_domain(ns, idx):
                continue
            idx.sort()
            for i in idx:
                d = row[i]
                assert d is not None
                work.apply(i, d, 1)
                chosen.append((c, i, d))
            rec(c + 1)
            for i in idx:
                d = row[i]
                assert d is not None
                work.apply(i, d, -1)
                chosen.pop()
            if len(out) >= max_takes:
                return

    rec(0)
    return out


def after_usage(ns: NodeState, take: Take) -> tuple[list[int], list[int], list[int], list[bool]]:
    """GPU usage of ``ns`` as it would be after ``take``: (memory, cores, sharers, exclusive)."""
    w = _Work(ns)
    for _, i, d in take:
        w.apply(i, d, 1)
    return w.mem, w.cores, w.sharers, w.excl


def fits_without(ns: NodeState, pod: PodRequest, removed: Sequence[PodPlacement]) -> bool:
    """Necessary condition (preemption pre-check): with the pods ``removed`` gone from ``ns``, the
    node has a pod slot, CPU and RAM for ``pod``, and each container alone finds ``gpu_count``
    cards that take its slice. Nothing is changed."""
    node = ns.static.node
    if not (node.schedulable and node.healthy):
        return False
    cpu, ram, slots = ns.cpu_free, ns.ram_free, ns.pods_free
    w = _Work(ns)
    gpus = ns.static.gpus
    for pp in removed:
        if pp.node != ns.name:
            continue
        cpu += pp.cpu_millicores
        ram += pp.ram_mib
        slots += 1
        for g in pp.gpus:
            w.sharers[g.index] -= 1
            if g.exclusive:
                w.excl[g.index] = False
                w.mem[g.index] -= gpus[g.index].memory_capacity_mib
                w.cores[g.index] -= gpus[g.index].cores_capacity
            else:
                w.mem[g.index] -= g.gpu_memory_mib
                w.cores[g.index] -= g.gpu_cores_percent
    if slots < 1 or pod.cpu_millicores > cpu or pod.ram_mib > ram:
        return False
    for c, row in zip(pod.containers, container_demands(ns, pod), strict=True):
        n = sum(1 for i, d in enumerate(row) if d is not None and w.fits(i, d))
        if n < c.gpu_count:
            return False
    return True
