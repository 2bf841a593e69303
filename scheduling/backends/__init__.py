"""Cluster backends: ``kubernetes`` (the official client) and ``simulated`` (built in)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..models import Cluster
    from .base import CallBudget, ClusterBackend

_BUDGETS: ContextVar[dict[int, list[Any]] | None] = ContextVar("camp_cluster_budgets", default=None)
"""Cluster id → [its CallBudget, the backend made under it (or None yet)] of the periodic run
in progress (``budgeted``)."""


@contextlib.contextmanager
def budgeted(cluster_id: int, budget: CallBudget) -> Iterator[None]:
    """Inside: every ``backend_for`` of that cluster is one backend whose calls keep to
    ``budget`` (``services.cluster_periodic``, the gate of periodic cluster calls): the
    services a periodic task calls need not pass it along, and new ones are covered too."""
    current = _BUDGETS.get() or {}
    token = _BUDGETS.set({**current, cluster_id: [budget, None]})
    try:
        yield
    finally:
        _BUDGETS.reset(token)


def backend_for(cluster: Cluster) -> ClusterBackend:
    """The backend that talks to ``cluster`` (chosen by its settings, never by code edits)."""
    from ..models import Backend

    if cluster.backend == Backend.KUBERNETES:
        from .kubernetes import KubernetesBackend

        entry = (_BUDGETS.get() or {}).get(cluster.pk)
        if entry is None:
            return KubernetesBackend.for_cluster(cluster)
        if entry[1] is None:
            made = KubernetesBackend.for_cluster(cluster)
            made.budget = entry[0]
            entry[1] = made
        backend: ClusterBackend = entry[1]
        return backend
    from .simulated import SimulatedBackend

    return SimulatedBackend(cluster)
