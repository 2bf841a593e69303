"""The scheduler policy chosen per cluster decides where pods land."""

from __future__ import annotations

import pytest

from scheduling import services
from scheduling.models import Allocation, Cluster
from tests.conftest import World, client_for

from .conftest import SMALL_INVENTORY, submit

pytestmark = pytest.mark.django_db


def _nodes_used(world: World, policy: str) -> set[str]:
    cluster = services.cluster_create(actor=world.admin, name=f"c-{policy}", backend="simulated",
                                      inventory=SMALL_INVENTORY, placement_policy=policy)
    services.inventory_sync(cluster=cluster)
    for i in range(2):
        submit(world, cluster, f"one-{policy}-{i}", group={"gpu_count": 1, "gpu_models": ["A100-80G"]})
    services.cycle_run(cluster=cluster)
    return set(Allocation.objects.filter(cluster=cluster).values_list("node__name", flat=True))


@pytest.mark.parametrize("policy, nodes", [("binpack", 1), ("spread", 2), ("fragmentation", 1)])
def test_policy_decides_packing(world: World, policy: str, nodes: int) -> None:
    assert len(_nodes_used(world, policy)) == nodes


def test_policy_is_set_through_the_api_and_audited(world: World) -> None:
    from tenants.models import AuditEvent

    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    client = client_for(world.admin)
    response = client.patch(f"/api/v1/clusters/{cluster.pk}/", {"placement_policy": "spread"},
                            format="json")
    assert response.status_code == 200 and response.json()["placement_policy"] == "spread"
    assert Cluster.objects.get(pk=cluster.pk).placement_policy == "spread"
    event = AuditEvent.objects.filter(action="cluster.updated").latest("id")
    assert event.before["placement_policy"] == "fragmentation" and event.after["placement_policy"] == "spread"
    bad = client.patch(f"/api/v1/clusters/{cluster.pk}/", {"placement_policy": "chaos"}, format="json")
    assert bad.status_code == 400 and "placement_policy" in bad.json()
    owner = client_for(world.a.owner)
    denied = owner.patch(f"/api/v1/clusters/{cluster.pk}/", {"placement_policy": "binpack"}, format="json")
    assert denied.status_code in (403, 404)
