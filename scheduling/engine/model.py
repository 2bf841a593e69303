"""The resource model: frozen dataclasses that go into the engine, and the decisions that come out.

Resource names follow DESIGN.md §3: ``gpu_count``, ``gpu_memory_mib`` and ``gpu_cores_percent`` per
GPU, ``gpu_model`` selectors, ``exclusive`` for whole cards, ``cpu_millicores`` and ``ram_mib``.
Nothing here performs I/O; every type is immutable and hashable so snapshots can be shared and
cached freely.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------------
# Inventory
# --------------------------------------------------------------------------------------------------


class SharingMode(enum.StrEnum):
    """How a GPU may be divided between pods."""

    EXCLUSIVE_ONLY = "exclusive-only"
    """Only whole cards are handed out; a fractional request is aligned up to the whole card."""
    SHAREABLE = "shareable"
    """Any memory MiB / cores % slice (HAMi-core style soft isolation)."""
    TEMPLATES = "templates"
    """Vendor-fixed slice sizes (MIG-like); a request is aligned up to the smallest template."""


@dataclass(frozen=True, slots=True)
class SliceTemplate:
    """A vendor-fixed slice of one card (e.g. half a card, or 24 GB of memory)."""

    gpu_memory_mib: int
    gpu_cores_percent: int
    name: str = ""


@dataclass(frozen=True, slots=True)
class Overcommit:
    """Factors by which a GPU's memory and compute may be promised beyond its physical size."""

    memory: float = 1.0
    cores: float = 1.0


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU as the device plugin reports it."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    vendor: str = "NVIDIA"
    numa_node: int = 0
    healthy: bool = True
    sharing: SharingMode = SharingMode.SHAREABLE
    templates: tuple[SliceTemplate, ...] = ()
    max_sharers: int = 10
    """Maximum number of pods that may share this card (HAMi's ``count``)."""
    utilization_percent: float | None = None
    """Measured utilisation, when the snapshot carries metrics (used by the load-aware policy)."""
    foreign_memory_mib: int = 0
    """Held by pods this scheduler did not place (another scheduler's), like the next two: the
    card starts the cycle with that much in use, and it is never given back by preemption."""
    foreign_cores_percent: int = 0
    foreign_sharers: int = 0
    foreign_exclusive: bool = False
    """The whole card is held by such a pod."""

    @property
    def foreign(self) -> bool:
        return bool(self.foreign_memory_mib or self.foreign_cores_percent or self.foreign_sharers
                    or self.foreign_exclusive)


@dataclass(frozen=True, slots=True)
class Topology:
    """Intra-node GPU topology.

    ``nvlink_islands`` lists groups of GPU indices joined by NVLink/NVSwitch. ``link_matrix``, when
    given instead, holds a pairwise link score (higher is faster, e.g. NVLink count) indexed by GPU
    index. NUMA placement comes from each device's ``numa_node``.
    """

    nvlink_islands: tuple[frozenset[int], ...] = ()
    link_matrix: tuple[tuple[int, ...], ...] = ()


ARCH_LABEL = "kubernetes.io/arch"


@dataclass(frozen=True, slots=True)
class Node:
    """A schedulable machine with its GPUs."""

    name: str
    cpu_millicores: int
    ram_mib: int
    gpus: tuple[GpuDevice, ...] = ()
    max_pods: int = 110
    labels: tuple[tuple[str, str], ...] = ()
    pool: str = ""
    schedulable: bool = True
    healthy: bool = True
    topology: Topology = field(default_factory=Topology)
    overcommit: Overcommit | None = None
    """Per-node overcommit; falls back to the snapshot's per-model factors, then to 1.0."""

    @property
    def arch(self) -> str:
        """The node's CPU architecture: its ``kubernetes.io/arch`` label (set by the kubelet on
        every node), ``amd64`` when absent."""
        for k, v in self.labels:
            if k == ARCH_LABEL:
                return v
        return "amd64"


# --------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """The GPU ask of one container: ``gpu_count`` GPUs, each with the same slice.

    A slice is ``gpu_memory_mib`` (or ``gpu_memory_percent`` of the card) and ``gpu_cores_percent``.
    With no memory, no percentage and no cores the request means whole cards, as does ``exclusive``.
    """

    gpu_count: int = 1
    gpu_memory_mib: int = 0
    gpu_memory_percent: int = 0
    gpu_cores_percent: int = 0
    exclusive: bool = False

    @property
    def whole_cards(self) -> bool:
        """True when the request asks for entire cards."""
        return self.exclusive or (
            self.gpu_memory_mib == 0 and self.gpu_memory_percent == 0 and self.gpu_cores_percent == 0
        )


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for: CPU, RAM and the GPUs of each of its containers."""

    name: str
    cpu_millicores: int = 0
    ram_mib: int = 0
    containers: tuple[GpuRequest, ...] = ()
    gpu_models: frozenset[str] = frozenset()
    """Allowed GPU models; empty means any."""
    excluded_gpu_models: frozenset[str] = frozenset()
    arches: frozenset[str] = frozenset()
    """CPU architectures its image runs on (``amd64``, ``arm64``); empty means any."""

    @property
    def gpu_count(self) -> int:
        """GPUs requested over all containers."""
        return sum(c.gpu_count for c in self.containers)

    def allows_model(self, model: str) -> bool:
        """Rule: a GPU model is usable iff it is allowed (or no allowlist) and not excluded."""
        if model in self.excluded_gpu_models:
            return False
        return not self.gpu_models or model in self.gpu_models


def pod(
    name: str,
    *,
    gpu_count: int = 0,
    gpu_memory_mib: int = 0,
    gpu_memory_percent: int = 0,
    gpu_cores_percent: int = 0,
    exclusive: bool = False,
    cpu_millicores: int = 0,
    ram_mib: int = 0,
    gpu_models: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
    excluded_gpu_models: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
    arches: frozenset[str] | set[str] | tuple[str, ...] = frozenset(),
) -> PodRequest:
    """Build a single-container :class:`PodRequest` (the common case)."""
    containers: tuple[GpuRequest, ...] = ()
    if gpu_count > 0:
        containers = (
            GpuRequest(
                gpu_count=gpu_count,
                gpu_memory_mib=gpu_memory_mib,
                gpu_memory_percent=gpu_memory_percent,
                gpu_cores_percent=gpu_cores_percent,
                exclusive=exclusive,
            ),
        )
    return PodRequest(
        name=name,
        cpu_millicores=cpu_millicores,
        ram_mib=ram_mib,
        containers=containers,
        gpu_models=frozenset(gpu_models),
        excluded_gpu_models=frozenset(excluded_gpu_models),
        arches=frozenset(arches),
    )


class JobAffinity(enum.StrEnum):
    """Where the pods of one job go relative to each other."""

    NONE = "none"
    SAME_NODE = "same-node"
    """All pods on one node (e.g. draft and target models sharing memory)."""
    DISTINCT_NODES = "distinct-nodes"
    """Every pod on a different node."""


@dataclass(frozen=True, slots=True)
class PodGroup:
    """``replicas`` identical pods of one role (launcher, worker, ...)."""

    name: str
    template: PodRequest
    replicas: int = 1


@dataclass(frozen=True, slots=True)
class Job:
    """A unit of admission: one or more pod groups, placed all at once when ``gang`` is set."""

    name: str
    groups: tuple[PodGroup, ...]
    gang: bool = True
    priority: int = 0
    priority_class: str = ""
    queue: str = ""
    """The queue (project) this job is charged to."""
    preemptible: bool = False
    submit_time: float = 0.0
    runtime_estimate_s: float | None = None
    start_time: float | None = None
    checkpointable: bool = False
    affinity: JobAffinity = JobAffinity.NONE
    mixed_gpu_models: bool = False
    """Its pods may run on GPUs of different models (by default all on one model)."""

    def pods(self) -> tuple[PodRequest, ...]:
        """Expand the groups into named pods: ``<job>-<group>-<i>``."""
        out: list[PodRequest] = []
        for g in self.groups:
            for i in range(g.replicas):
                name = f"{self.name}-{g.name}-{i}"
                out.append(
                    PodRequest(
                        name=name,
                        cpu_millicores=g.template.cpu_millicores,
                        ram_mib=g.template.ram_mib,
                        containers=g.template.containers,
                        gpu_models=g.template.gpu_models,
                        excluded_gpu_models=g.template.excluded_gpu_models,
                        arches=g.template.arches,
                    )
                )
        return tuple(out)


# --------------------------------------------------------------------------------------------------
# Placements and running allocations
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuGrant:
    """One GPU slice granted to one container, after template alignment."""

    index: int
    uuid: str
    gpu_model: str
    gpu_memory_mib: int
    gpu_cores_percent: int
    exclusive: bool = False
    container: int = 0
    requested_memory_mib: int = 0
    requested_cores_percent: int = 0
    alignment: str = ""
    """Empty when granted as asked, else how the slice was rounded up (template, whole card)."""
    vendor: str = "NVIDIA"
    card_memory_mib: int = 0
    """The card's memory (what the slice's memory share is of: ``accounting.slice_milli``)."""


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one pod goes: its node and, per GPU, the slice it gets."""

    pod: str
    node: str
    gpus: tuple[GpuGrant, ...] = ()
    cpu_millicores: int = 0
    ram_mib: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    """The placement of every pod of one job."""

    pods: tuple[PodPlacement, ...]

    def nodes(self) -> tuple[str, ...]:
        """The nodes used, in pod order."""
        return tuple(p.node for p in self.pods)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A running pod's resources, as recorded in the snapshot (e.g. from allocation rows)."""

    job: str
    placement: PodPlacement
    queue: str = ""
    priority: int = 0
    preemptible: bool = False
    start_time: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """An immutable view of the cluster at the start of a scheduling cycle."""

    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...] = ()
    model_overcommit: tuple[tuple[str, Overcommit], ...] = ()
    """Per-GPU-model overcommit factors, used where a node sets none."""

    def overcommit_for(self, node: Node, model: str) -> Overcommit:
        """Rule: a node's own factors win, then the model's, then no overcommit."""
        if node.overcommit is not None:
            return node.overcommit
        for m, oc in self.model_overcommit:
            if m == model:
                return oc
        return Overcommit()


def model_overcommit(mapping: Mapping[str, Overcommit]) -> tuple[tuple[str, Overcommit], ...]:
    """Freeze a ``{model: Overcommit}`` mapping for :class:`ClusterSnapshot`."""
    return tuple(sorted(mapping.items()))


# --------------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Admit:
    """Start the job now with this placement."""

    job: str
    placement: Placement


@dataclass(frozen=True, slots=True)
class Wait:
    """The job cannot fit now; ``reason`` says why in words a user understands."""

    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Reject:
    """The job can never fit on this cluster (shape larger than any node, no allowed GPU model)."""

    job: str
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Evict ``victims`` (allocation job names) so that ``job`` can start with ``placement``.

    Produced by the queueing layer (issue 4); placement itself never preempts.
    """

    job: str
    victims: tuple[str, ...]
    placement: Placement


Decision = Admit | Wait | Reject | Preempt
