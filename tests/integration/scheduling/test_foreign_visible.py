"""Cards held by pods Camp did not create are not shown as free (issue 11 review): the nodes
API carries the foreign figures of each card (not the pods' names, which belong to no Camp
tenant), and the cluster's state (dashboard, metrics) counts such cards apart from free."""

from __future__ import annotations

from typing import Any

import pytest

from portal import selectors as portal_selectors
from scheduling.models import GpuDevice
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def test_cards_held_by_other_pods_are_not_shown_free(world: Any, sim_cluster: Any) -> None:
    GpuDevice.objects.filter(node__name="l4-0", index=0).update(
        foreign_memory_mib=8000, foreign_cores=30, foreign_sharers=1, foreign_pods=["ml/other"])
    GpuDevice.objects.filter(node__name="l4-0", index=1).update(
        foreign_exclusive=True, foreign_pods=["ml/whole"])
    nodes = client_for(world.a.member).get("/api/v1/nodes/?search=l4").json()["results"]
    gpus = {g["index"]: g for g in nodes[0]["gpus"]}
    assert (gpus[0]["foreign_memory_mib"], gpus[0]["foreign_cores"], gpus[0]["foreign_sharers"],
            gpus[0]["foreign_exclusive"]) == (8000, 30, 1, False)
    assert gpus[1]["foreign_exclusive"] is True
    assert "foreign_pods" not in gpus[0]  # pods of no Camp tenant: not for members
    now = portal_selectors.cluster_now(sim_cluster)
    assert now.gpus_held_by_others == 2 and now.gpus_in_use == 0
    assert now.gpu_memory_held_by_others_mib == 8000 + 23034
