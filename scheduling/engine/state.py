"""The mutable working state built from a frozen :class:`ClusterSnapshot`.

``ClusterState`` tracks free CPU, RAM, pod slots and, per GPU, the memory, cores and sharer slots
in use. ``reserve`` and ``unreserve`` apply or roll back a :class:`PodPlacement`, so callers can
try a gang and undo it. Nodes with identical static shape and identical usage share a *signature*;
the placer scores one representative per signature and caches the result (pure functions of the
signature), which is what makes placement fast on large clusters.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from dataclasses import dataclass, field

from scheduling.engine import accounting
from scheduling.engine.model import (
    ClusterSnapshot,
    GpuDevice,
    GpuGrant,
    GpuRequest,
    Node,
    PodPlacement,
    SharingMode,
    SliceTemplate,
)

# --------------------------------------------------------------------------------------------------
# Template alignment: a container's request turned into the slice one particular card would grant
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Demand:
    """The slice a card grants for one GPU of a container request, after alignment."""

    gpu_memory_mib: int
    gpu_cores_percent: int
    exclusive: bool
    requested_memory_mib: int
    requested_cores_percent: int
    alignment: str = ""


WHOLE_CARD_FOR_SLICE = "whole card (exclusive-only GPU)"
"""The alignment of a fractional request on a card that cannot be shared (no HAMi there)."""

_DEMAND_CACHE: dict[tuple[object, ...], Demand | None] = {}


def align_demand(gpu: GpuDevice, req: GpuRequest) -> Demand | None:
    """Rule (alignment): turn a per-GPU request into the slice this card would grant, or None.

    * whole-card or ``exclusive`` requests take the entire card (memory and 100 % cores);
    * ``gpu_memory_percent`` is a share of this card's memory, rounded up to whole MiB;
    * an exclusive-only card aligns any fractional request up to the whole card;
    * a templated card aligns up to the smallest template covering memory and cores;
    * a slice larger than the card (or than every template) can never be granted: None.
    """
    key = (gpu.memory_mib, gpu.sharing, gpu.templates, req)
    try:
        return _DEMAND_CACHE[key]
    except KeyError:
        pass
    d = _align(gpu.memory_mib, gpu.sharing, gpu.templates, req)
    if len(_DEMAND_CACHE) > 100_000:
        _DEMAND_CACHE.clear()
    _DEMAND_CACHE[key] = d
    return d


def _align(
    memory_mib: int, sharing: SharingMode, templates: tuple[SliceTemplate, ...], req: GpuRequest
) -> Demand | None:
    if req.whole_cards:
        return Demand(memory_mib, 100, True, memory_mib, 100)
    mem = req.gpu_memory_mib
    if req.gpu_memory_percent:
        mem = max(mem, math.ceil(req.gpu_memory_percent * memory_mib / 100))
    cores = req.gpu_cores_percent
    if mem > memory_mib or cores > 100 or mem < 0 or cores < 0:
        return None
    if sharing == SharingMode.EXCLUSIVE_ONLY:
        return Demand(memory_mib, 100, True, mem, cores, WHOLE_CARD_FOR_SLICE)
    if sharing == SharingMode.TEMPLATES and templates:
        fitting = [t for t in templates if t.gpu_memory_mib >= mem and t.gpu_cores_percent >= cores]
        if not fitting:
            return None
        t = min(fitting, key=lambda t: (t.gpu_memory_mib, t.gpu_cores_percent))
        if t.gpu_memory_mib == mem and t.gpu_cores_percent == cores:
            return Demand(mem, cores, False, mem, cores, "")
        name = t.name or f"{t.gpu_memory_mib}MiB/{t.gpu_cores_percent}%"
        return Demand(t.gpu_memory_mib, t.gpu_cores_percent, False, mem, cores, f"template {name}")
    return Demand(mem, cores, False, mem, cores)


# --------------------------------------------------------------------------------------------------
# Static and dynamic node state
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuStatic:
    """What never changes about a GPU during a cycle, with overcommit applied to capacities."""

    device: GpuDevice
    memory_capacity_mib: int
    cores_capacity: int
    island: int
    """NVLink island id (-1 when the node declares none)."""


@dataclass(frozen=True, slots=True)
class NodeStatic:
    """The static part of a node; ``class_id`` is shared by nodes of identical shape."""

    node: Node
    class_id: int
    gpus: tuple[GpuStatic, ...]
    models: frozenset[str]
    demands: dict[tuple[object, ...], tuple[tuple[Demand | None, ...], ...]] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    """Per pod shape, the aligned slice per container and card (see
    :func:`scheduling.engine.candidates.container_demands`); one dict shared by every node of the
    class, since it depends only on the class's cards."""
    allowed: dict[tuple[frozenset[str], frozenset[str]], int] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )
    """Per (allowed, excluded) GPU models, how many cards qualify (shared by the class)."""


class NodeState:
    """Free resources of one node. Mutated only through :class:`ClusterState`."""

    __slots__ = (
        "static",
        "name",
        "cpu_free",
        "ram_free",
        "pods_free",
        "mem_used",
        "cores_used",
        "sharers",
        "exclusive",
        "sig_id",
    )

    def __init__(self, static: NodeStatic, *, foreign: bool = True) -> None:
        n = static.node
        self.static = static
        self.name = n.name
        self.cpu_free = n.cpu_millicores
        self.ram_free = n.ram_mib
        self.pods_free = n.max_pods
        # Rule (foreign usage): what pods of other schedulers hold is in use from the start
        # (``foreign=False``: the node as if even they were gone, for "could it ever fit").
        devs = [gs.device if foreign else None for gs in static.gpus]
        self.mem_used = [0 if d is None else gs.memory_capacity_mib if d.foreign_exclusive
                         else d.foreign_memory_mib for gs, d in zip(static.gpus, devs, strict=True)]
        self.cores_used = [0 if d is None else gs.cores_capacity if d.foreign_exclusive
                           else d.foreign_cores_percent for gs, d in zip(static.gpus, devs, strict=True)]
        self.sharers = [0 if d is None else d.foreign_sharers + int(d.foreign_exclusive) for d in devs]
        self.exclusive = [d is not None and d.foreign_exclusive for d in devs]
        self.sig_id = -1

    def signature(self) -> tuple[object, ...]:
        """Everything that decides feasibility and score on this node, except its name."""
        return (
            self.static.class_id,
            self.cpu_free,
            self.ram_free,
            self.pods_free,
            tuple(self.mem_used),
            tuple(self.cores_used),
            tuple(self.sharers),
            tuple(self.exclusive),
        )

    def gpu_fits(self, i: int, d: Demand) -> bool:
        """Rule (card fit): a card takes a slice iff it is healthy, not held exclusively, has a
        free sharer slot, and memory and cores stay within capacity × overcommit; an exclusive
        slice needs an untouched card."""
        gs = self.static.gpus[i]
        if not gs.device.healthy or self.exclusive[i]:
            return False
        if d.exclusive:
            return self.sharers[i] == 0
        return (
            self.sharers[i] < gs.device.max_sharers
            and self.mem_used[i] + d.gpu_memory_mib <= gs.memory_capacity_mib
            and self.cores_used[i] + d.gpu_cores_percent <= gs.cores_capacity
        )

    def gpu_fits_but_for_foreign(self, i: int, d: Demand) -> bool:
        """Whether card ``i`` would take ``d`` were it not for pods of other schedulers."""
        gs = self.static.gpus[i]
        dev = gs.device
        if not dev.foreign or not gs.device.healthy:
            return False
        if dev.foreign_exclusive:
            return self.sharers[i] == 1 and (d.exclusive or d.gpu_memory_mib <= gs.memory_capacity_mib)
        sharers = self.sharers[i] - dev.foreign_sharers
        if self.exclusive[i]:
            return False
        if d.exclusive:
            return sharers == 0
        return (
            sharers < dev.max_sharers
            and self.mem_used[i] - dev.foreign_memory_mib + d.gpu_memory_mib <= gs.memory_capacity_mib
            and self.cores_used[i] - dev.foreign_cores_percent + d.gpu_cores_percent <= gs.cores_capacity
        )

    def free_share(self, i: int, memory_weight: float) -> float:
        """Free fraction of card ``i`` (0..1), memory weighted above compute."""
        gs = self.static.gpus[i]
        if self.exclusive[i] or not gs.device.healthy:
            return 0.0
        if self.sharers[i] >= gs.device.max_sharers:
            return 0.0
        m = max(0, gs.memory_capacity_mib - self.mem_used[i]) / gs.memory_capacity_mib
        c = max(0, gs.cores_capacity - self.cores_used[i]) / gs.cores_capacity
        return memory_weight * min(m, 1.0) + (1.0 - memory_weight) * min(c, 1.0)


def empty_node(node: Node) -> Node:
    """``node`` as it would be with nothing running, not even other schedulers' pods."""
    if not any(g.foreign for g in node.gpus):
        return node
    return dataclasses.replace(node, gpus=tuple(dataclasses.replace(
        g, foreign_memory_mib=0, foreign_cores_percent=0, foreign_sharers=0, foreign_exclusive=False)
        for g in node.gpus))


class ReservationError(ValueError):
    """A placement does not fit the current state."""


class ClusterState:
    """Mutable working state for one scheduling cycle (or one simulation)."""

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        self.snapshot = snapshot
        self.nodes: dict[str, NodeState] = {}
        self._class_ids: dict[tuple[object, ...], int] = {}
        self._sig_ids: dict[tuple[object, ...], int] = {}
        self.groups: dict[int, list[str]] = {}
        """signature id → sorted names of the nodes in that state."""
        self._class_demands: dict[int, dict[tuple[object, ...], tuple[tuple[Demand | None, ...], ...]]] = {}
        self._class_allowed: dict[int, dict[tuple[frozenset[str], frozenset[str]], int]] = {}
        self.version = 0
        self.gpu_models: set[str] = set()
        """Every GPU model of the cluster's nodes."""
        self.model_cards: dict[str, int] = {}
        """Cards of each GPU model on the cluster's nodes (used or not, healthy or not)."""
        for node in snapshot.nodes:
            self._add_node(node)
        for alloc in snapshot.allocations:
            self.reserve(alloc.placement, check=False)

    # -- construction --------------------------------------------------------------------------

    def _add_node(self, node: Node) -> None:
        if node.name in self.nodes:
            raise ValueError(f"duplicate node {node.name!r}")
        islands: dict[int, int] = {}
        for k, isl in enumerate(node.topology.nvlink_islands):
            for idx in isl:
                islands[idx] = k
        gpus = []
        for dev in node.gpus:
            oc = self.snapshot.overcommit_for(node, dev.model)
            gpus.append(
                GpuStatic(
                    device=dev,
                    memory_capacity_mib=int(dev.memory_mib * oc.memory),
                    cores_capacity=int(100 * oc.cores),
                    island=islands.get(dev.index, -1),
                )
            )
        class_key: tuple[object, ...] = (
            node.cpu_millicores,
            node.ram_mib,
            node.max_pods,
            node.labels,
            node.pool,
            node.schedulable and node.healthy,
            node.topology,
            tuple(
                (
                    g.device.model,
                    g.device.vendor,
                    g.device.memory_mib,
                    g.memory_capacity_mib,
                    g.cores_capacity,
                    g.device.numa_node,
                    g.device.healthy,
                    g.device.sharing,
                    g.device.templates,
                    g.device.max_sharers,
                    g.device.utilization_percent,
                    g.island,
                    # Per-class caches (e.g. "could this node host it") see foreign usage.
                    g.device.foreign_memory_mib,
                    g.device.foreign_cores_percent,
                    g.device.foreign_sharers,
                    g.device.foreign_exclusive,
                )
                for g in gpus
            ),
        )
        cid = self._class_ids.setdefault(class_key, len(self._class_ids))
        static = NodeStatic(
            node=node,
            class_id=cid,
            gpus=tuple(gpus),
            models=frozenset(d.model for d in node.gpus),
            demands=self._class_demands.setdefault(cid, {}),
            allowed=self._class_allowed.setdefault(cid, {}),
        )
        ns = NodeState(static)
        self.gpu_models |= static.models
        for d in node.gpus:
            self.model_cards[d.model] = self.model_cards.get(d.model, 0) + 1
        self.nodes[node.name] = ns
        self._regroup(ns)

    # -- grouping ------------------------------------------------------------------------------

    def _regroup(self, ns: NodeState) -> None:
        old = ns.sig_id
        if old >= 0:
            names = self.groups[old]
            names.pop(bisect.bisect_left(names, ns.name))
            if not names:
                del self.groups[old]
        sig = ns.signature()
        sid = self._sig_ids.get(sig)
        if sid is None:
            sid = len(self._sig_ids)
            self._sig_ids[sig] = sid
        ns.sig_id = sid
        group = self.groups.get(sid)
        if group is None:
            self.groups[sid] = [ns.name]
        else:
            bisect.insort(group, ns.name)

    # -- free room -----------------------------------------------------------------------------

    def free_room(self) -> tuple[int, int]:
        """Rule (free room): what Camp could still place now, as (milli-GPUs, CPU millicores), on
        schedulable, healthy nodes. A card counts its free share in the one GPU unit
        (:func:`accounting.card_free_milli`: the smaller of its free compute and free memory
        share, capacities with overcommit); a card that is unhealthy, held whole (by Camp or by
        another scheduler's pods) or has no free sharer slot counts none. What other schedulers'
        pods hold is not free (it is in the state from the start)."""
        milli = cpu = 0
        for ns in self.nodes.values():
            node = ns.static.node
            if not (node.schedulable and node.healthy):
                continue
            cpu += max(0, ns.cpu_free)
            for i, gs in enumerate(ns.static.gpus):
                if (not gs.device.healthy or not gs.cores_capacity
                        or ns.sharers[i] >= gs.device.max_sharers):
                    continue
                milli += accounting.card_free_milli(
                    memory_mib=gs.memory_capacity_mib, memory_used_mib=ns.mem_used[i],
                    cores_used_percent=ns.cores_used[i] * 100 // gs.cores_capacity,
                    held_whole=bool(ns.exclusive[i]))
        return milli, cpu

    # -- reserve / unreserve -------------------------------------------------------------------

    def reserve(self, p: PodPlacement, *, check: bool = True) -> None:
        """Apply a pod placement. With ``check`` a placement that does not fit raises
        :class:`ReservationError` and leaves the state unchanged."""
        ns = self.nodes.get(p.node)
        if ns is None:
            raise ReservationError(f"unknown node {p.node!r}")
        if check:
            self._check(ns, p)
        ns.cpu_free -= p.cpu_millicores
        ns.ram_free -= p.ram_mib
        ns.pods_free -= 1
        for g in p.gpus:
            ns.sharers[g.index] += 1
            if g.exclusive:
                ns.exclusive[g.index] = True
                ns.mem_used[g.index] += ns.static.gpus[g.index].memory_capacity_mib
                ns.cores_used[g.index] += ns.static.gpus[g.index].cores_capacity
            else:
                ns.mem_used[g.index] += g.gpu_memory_mib
                ns.cores_used[g.index] += g.gpu_cores_percent
        self.version += 1
        self._regroup(ns)

    def unreserve(self, p: PodPlacement) -> None:
        """Roll back a pod placement applied with :meth:`reserve`."""
        ns = self.nodes[p.node]
        ns.cpu_free += p.cpu_millicores
        ns.ram_free += p.ram_mib
        ns.pods_free += 1
        for g in p.gpus:
            ns.sharers[g.index] -= 1
            if g.exclusive:
                ns.exclusive[g.index] = False
                ns.mem_used[g.index] -= ns.static.gpus[g.index].memory_capacity_mib
                ns.cores_used[g.index] -= ns.static.gpus[g.index].cores_capacity
            else:
                ns.mem_used[g.index] -= g.gpu_memory_mib
                ns.cores_used[g.index] -= g.gpu_cores_percent
        self.version += 1
        self._regroup(ns)

    def _check(self, ns: NodeState, p: PodPlacement) -> None:
        if not (ns.static.node.schedulable and ns.static.node.healthy):
            raise ReservationError(f"node {ns.name} is not schedulable")
        if p.cpu_millicores > ns.cpu_free or p.ram_mib > ns.ram_free or ns.pods_free < 1:
            raise ReservationError(f"node {ns.name} lacks CPU, RAM or pod slots")
        # Apply grants one by one on copies so that several containers may share a card.
        mem = list(ns.mem_used)
        cores = list(ns.cores_used)
        sharers = list(ns.sharers)
        excl = list(ns.exclusive)
        for g in p.gpus:
            if not 0 <= g.index < len(ns.static.gpus):
                raise ReservationError(f"node {ns.name} has no GPU {g.index}")
            gs = ns.static.gpus[g.index]
            if not gs.device.healthy or excl[g.index]:
                raise ReservationError(f"GPU {g.index} on {ns.name} is unavailable")
            if g.exclusive:
                if sharers[g.index]:
                    raise ReservationError(f"GPU {g.index} on {ns.name} is in use")
                excl[g.index] = True
                mem[g.index] += gs.memory_capacity_mib
                cores[g.index] += gs.cores_capacity
            else:
                mem[g.index] += g.gpu_memory_mib
                cores[g.index] += g.gpu_cores_percent
                if (
                    mem[g.index] > gs.memory_capacity_mib
                    or cores[g.index] > gs.cores_capacity
                    or sharers[g.index] >= gs.device.max_sharers
                ):
                    raise ReservationError(f"GPU {g.index} on {ns.name} is over-allocated")
            sharers[g.index] += 1

    # -- views ---------------------------------------------------------------------------------

    def grant(self, ns: NodeState, container: int, index: int, d: Demand) -> GpuGrant:
        """Describe a slice of card ``index`` on ``ns`` as a :class:`GpuGrant`."""
        dev = ns.static.gpus[index].device
        return GpuGrant(
            index=index,
            uuid=dev.uuid,
            gpu_model=dev.model,
            gpu_memory_mib=d.gpu_memory_mib,
            gpu_cores_percent=d.gpu_cores_percent,
            exclusive=d.exclusive,
            container=container,
            requested_memory_mib=d.requested_memory_mib,
            requested_cores_percent=d.requested_cores_percent,
            alignment=d.alignment,
            vendor=dev.vendor,
            card_memory_mib=dev.memory_mib,
        )
