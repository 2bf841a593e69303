"""Cluster backends: ``kubernetes`` (the official client) and ``simulated`` (built in)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..models import Cluster
    from .base import ClusterBackend


def backend_for(cluster: Cluster) -> ClusterBackend:
    """The backend that talks to ``cluster`` (chosen by its settings, never by code edits)."""
    from ..models import Backend

    if cluster.backend == Backend.KUBERNETES:
        from .kubernetes import KubernetesBackend

        return KubernetesBackend.for_cluster(cluster)
    from .simulated import SimulatedBackend

    return SimulatedBackend(cluster)
