"""GPU fragmentation measured against the workload (FGD, Weng et al., USENIX ATC'23).

The *workload profile* is the distribution of pod shapes the cluster expects (the most popular
shapes covering 95 % of pods, as in the paper). For one node and one shape, the free GPU capacity
that the shape cannot use is a *fragment*: all free capacity when the shape cannot run on the node
at all (CPU, RAM, model or too few cards), otherwise the free capacity of each card too small for
one GPU of the shape. The node's fragmentation is the expectation over the profile.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduling.engine.model import GpuDevice, PodRequest
from scheduling.engine.state import Demand, NodeStatic, align_demand


def shape_key(p: PodRequest) -> PodRequest:
    """The pod's request without its name (its *shape*)."""
    return PodRequest(
        name="",
        cpu_millicores=p.cpu_millicores,
        ram_mib=p.ram_mib,
        containers=p.containers,
        gpu_models=p.gpu_models,
        excluded_gpu_models=p.excluded_gpu_models,
        arches=p.arches,
    )


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """Pod shapes with their probabilities (summing to 1)."""

    shapes: tuple[tuple[PodRequest, float], ...]

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest], *, popularity: float = 0.95) -> WorkloadProfile:
        """Rule (typical pods): count shapes, keep the most frequent ones until they cover
        ``popularity`` of all pods, and renormalise (FGD's ``podPopularityThreshold``)."""
        counts = Counter(shape_key(p) for p in pods)
        total = sum(counts.values())
        if not total:
            return cls(())
        ordered = sorted(counts.items(), key=lambda kv: (-kv[1], _order_key(kv[0])))
        kept: list[tuple[PodRequest, int]] = []
        cum = 0
        for shape, n in ordered:
            if cum >= popularity * total:
                break
            kept.append((shape, n))
            cum += n
        return cls(tuple((s, n / cum) for s, n in kept))

    def __bool__(self) -> bool:
        return bool(self.shapes)


def _order_key(p: PodRequest) -> tuple[object, ...]:
    return (
        p.cpu_millicores,
        p.ram_mib,
        tuple(
            (c.gpu_count, c.gpu_memory_mib, c.gpu_memory_percent, c.gpu_cores_percent) for c in p.containers
        ),
        tuple(sorted(p.gpu_models)),
        tuple(sorted(p.excluded_gpu_models)),
    )


@dataclass(frozen=True, slots=True)
class CompiledShape:
    """One profile shape resolved against one node class."""

    weight: float
    cpu_millicores: int
    ram_mib: int
    gpu_count: int
    demand_vector: int
    """Index into :attr:`CompiledProfile.vectors`, or -1 when no card on the node may host it."""


@dataclass(frozen=True, slots=True)
class CompiledProfile:
    """A profile resolved against one node class: per distinct per-card demand, one vector."""

    vectors: tuple[tuple[Demand | None, ...], ...]
    shapes: tuple[CompiledShape, ...]


def compile_profile(static: NodeStatic, profile: WorkloadProfile) -> CompiledProfile:
    """Resolve every shape's per-card slice on this node class (model rules, alignment).

    Multi-container shapes are approximated by their first GPU container with the pod's total
    GPU count."""
    vectors: list[tuple[Demand | None, ...]] = []
    index: dict[tuple[Demand | None, ...], int] = {}
    shapes: list[CompiledShape] = []
    # Cards of one model, size and sharing mode align a request alike: resolve each kind once.
    kinds: dict[tuple[object, ...], GpuDevice] = {}
    card_kind: list[tuple[object, ...]] = []
    for gs in static.gpus:
        dev = gs.device
        kk = (dev.model, dev.memory_mib, dev.sharing, dev.templates)
        kinds.setdefault(kk, dev)
        card_kind.append(kk)
    for shape, w in profile.shapes:
        k = shape.gpu_count
        vi = -1
        if k:
            c = shape.containers[0]
            per_kind = {
                kk: align_demand(dev, c) if shape.allows_model(dev.model) else None
                for kk, dev in kinds.items()
            }
            vec = tuple(per_kind[kk] for kk in card_kind)
            if any(d is not None for d in vec):
                vi = index.get(vec, -1)
                if vi < 0:
                    vi = len(vectors)
                    vectors.append(vec)
                    index[vec] = vi
        shapes.append(CompiledShape(w, shape.cpu_millicores, shape.ram_mib, k, vi))
    return CompiledProfile(tuple(vectors), tuple(shapes))


def _share(free: float, capacity: float, used: float) -> float:
    if capacity <= 0:
        return 0.0 if used else 1.0
    return min(1.0, max(0.0, free) / capacity)


def fragmentation(
    static: NodeStatic,
    compiled: CompiledProfile,
    cpu_free: int,
    ram_free: int,
    mem_used: Sequence[int],
    cores_used: Sequence[int],
    sharers: Sequence[int],
    exclusive: Sequence[bool],
    *,
    memory_weight: float,
    cpu_only_counts: bool,
    check_ram: bool = True,
) -> tuple[float, float]:
    """Expected fragmented GPU capacity of a node (in cards) and its total free capacity.

    ``cpu_only_counts`` reproduces FGD's accounting in which CPU-only shapes see every free GPU
    as a fragment (a constant shift for every node, kept for fidelity)."""
    gpus = static.gpus
    n = len(gpus)
    free = [0.0] * n
    mem_free = [0] * n
    cores_free = [0] * n
    usable = [False] * n
    for i in range(n):
        gs = gpus[i]
        dev = gs.device
        if exclusive[i] or not dev.healthy or sharers[i] >= dev.max_sharers:
            continue
        mf = gs.memory_capacity_mib - mem_used[i]
        cf = gs.cores_capacity - cores_used[i]
        mem_free[i] = mf
        cores_free[i] = cf
        usable[i] = True
        # (a card of unknown size — nvidia.com/gpu without GFD's memory label — is free or not)
        free[i] = memory_weight * _share(mf, gs.memory_capacity_mib, mem_used[i]) + (
            1.0 - memory_weight) * _share(cf, gs.cores_capacity, cores_used[i])
    total = sum(free)
    if total <= 0.0:
        return 0.0, 0.0
    per_vec: list[tuple[int, float]] = []
    for vec in compiled.vectors:
        cnt = 0
        frag = 0.0
        for i in range(n):
            d = vec[i]
            if (
                d is not None
                and usable[i]
                and (
                    sharers[i] == 0
                    if d.exclusive
                    else d.gpu_memory_mib <= mem_free[i] and d.gpu_cores_percent <= cores_free[i]
                )
            ):
                cnt += 1
            else:
                frag += free[i]
        per_vec.append((cnt, frag))
    result = 0.0
    for s in compiled.shapes:
        if s.gpu_count == 0:
            if cpu_only_counts:
                result += s.weight * total
            continue
        if s.demand_vector < 0 or cpu_free < s.cpu_millicores or (check_ram and ram_free < s.ram_mib):
            result += s.weight * total
            continue
        cnt, frag = per_vec[s.demand_vector]
        result += s.weight * (total if cnt < s.gpu_count else frag)
    return result, total
