"""Camp's placement engine: pure Python, no I/O (DESIGN.md §3).

Pipeline, for each pending job in order::

    ClusterSnapshot ──► ClusterState (mutable: free CPU/RAM/pod slots, per-card memory/cores)
    job ──► pods ──► per pod:  filter nodes  → search card combinations → score → select → reserve
                               (node_filter)   (enumerate_takes)          (Policy)  (Placer.find)
    gang: all pods reserved or all rolled back ──► Admit(placement) | Wait(reason) | Reject(reason)

Public API:

* model — ``Node``, ``GpuDevice``, ``Topology``, ``SharingMode``, ``SliceTemplate``,
  ``Overcommit``, ``ClusterSnapshot``, ``Allocation``; ``PodRequest``/``GpuRequest`` (and the
  ``pod(...)`` builder), ``PodGroup``, ``Job``, ``JobAffinity``; ``Placement``, ``PodPlacement``,
  ``GpuGrant``; decisions ``Admit``, ``Wait``, ``Reject``, ``Preempt``.
* ``ClusterState(snapshot)`` with ``reserve(pod_placement)`` / ``unreserve(pod_placement)``.
* ``Placer(state, policy)``: ``find(pod)``, ``place_pod(pod)``, ``place_job(job)``,
  ``ranked(pod)``, ``why_not(pod)``, ``never_fits(pod)``.
* ``schedule(snapshot, jobs, policy=None)`` — one cycle, decisions in job order.
* policies — ``FragmentationPolicy`` (the default), ``ResourcePolicy`` (binpack/spread × node/card,
  topology, load), ``FGDPolicy``, ``BestFitPolicy``, ``RandomPolicy``; ``WorkloadProfile``.

Nothing here imports Django, Celery or a Kubernetes client (``tests/unit/engine`` enforces it).
"""

from scheduling.engine.candidates import Take, enumerate_takes
from scheduling.engine.fragmentation import WorkloadProfile
from scheduling.engine.model import (
    Admit,
    Allocation,
    ClusterSnapshot,
    Decision,
    GpuDevice,
    GpuGrant,
    GpuRequest,
    Job,
    JobAffinity,
    Node,
    Overcommit,
    Placement,
    PodGroup,
    PodPlacement,
    PodRequest,
    Preempt,
    Reject,
    SharingMode,
    SliceTemplate,
    Topology,
    Wait,
    model_overcommit,
    pod,
)
from scheduling.engine.placement import Placer, node_filter, profile_for, schedule
from scheduling.engine.policies import (
    BestFitPolicy,
    FGDPolicy,
    FragmentationPolicy,
    Policy,
    RandomPolicy,
    ResourcePolicy,
    default_policy,
)
from scheduling.engine.state import ClusterState, Demand, ReservationError, align_demand

__all__ = [
    "Admit",
    "Allocation",
    "BestFitPolicy",
    "ClusterSnapshot",
    "ClusterState",
    "Decision",
    "Demand",
    "FGDPolicy",
    "FragmentationPolicy",
    "GpuDevice",
    "GpuGrant",
    "GpuRequest",
    "Job",
    "JobAffinity",
    "Node",
    "Overcommit",
    "Placement",
    "Placer",
    "PodGroup",
    "PodPlacement",
    "PodRequest",
    "Policy",
    "Preempt",
    "RandomPolicy",
    "Reject",
    "ReservationError",
    "ResourcePolicy",
    "SharingMode",
    "SliceTemplate",
    "Take",
    "Topology",
    "Wait",
    "WorkloadProfile",
    "align_demand",
    "default_policy",
    "enumerate_takes",
    "model_overcommit",
    "node_filter",
    "pod",
    "profile_for",
    "schedule",
]
