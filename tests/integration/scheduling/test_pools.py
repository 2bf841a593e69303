"""Node pools: nodes selected by labels, shared or dedicated to tenants (real services,
real PostgreSQL, the simulated backend)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling import services
from scheduling.models import Job, JobState, Node
from tenants.models import AuditEvent
from tests.conftest import client_for

from .conftest import gpu_group, submit

pytestmark = pytest.mark.django_db

INVENTORY = """
start_delay_seconds: 0
default_duration_seconds: 3600
nodes:
  - name: sec-0
    cpu_cores: 64
    ram_gib: 512
    labels: {tier: secure}
    gpus: {model: A100-80G, count: 4, memory_mib: 81920}
  - name: pub-0
    cpu_cores: 4
    ram_gib: 64
    labels: {tier: public}
    gpus: {model: L4, count: 2, memory_mib: 23034}
"""


@pytest.fixture
def cluster(world: Any) -> Any:
    c = services.cluster_create(actor=world.admin, name="pools", inventory=INVENTORY)
    services.inventory_sync(cluster=c)
    return c


@pytest.fixture
def secure(world: Any, cluster: Any) -> Any:
    return services.nodepool_create(actor=world.admin, cluster=cluster, name="secure",
                                    selector={"tier": "secure"}, dedicated=True,
                                    tenants=[world.a.tenant])


def _cycle(cluster: Any, *jobs: Job) -> list[Job]:
    assert services.cycle_run(cluster=cluster) is not None
    for j in jobs:
        j.refresh_from_db()
    return list(jobs)


def _nodes(job: Job) -> set[str]:
    return set(job.allocations.values_list("node__name", flat=True))


def test_dedicated_pool_places_only_its_tenants_jobs(world: Any, cluster: Any, secure: Any) -> None:
    assert dict(Node.objects.values_list("name", "pool")) == {"sec-0": "secure", "pub-0": ""}
    g1 = submit(world, cluster, "g1", side="b")  # one whole GPU: the shared L4 node
    g2 = submit(world, cluster, "g2", side="b", group={"gpu_count": 2})
    g3 = submit(world, cluster, "g3", side="b", group={"gpu_models": ["A100-80G"]})
    cpu = submit(world, cluster, "cpu", side="b",
                 groups=[gpu_group(gpu_count=0, cpu_millicores=8000)])
    a1 = submit(world, cluster, "a1", group={"gpu_models": ["A100-80G"], "gpu_count": 2})
    g1, g2, g3, cpu, a1 = _cycle(cluster, g1, g2, g3, cpu, a1)

    assert g1.state == JobState.STARTING and _nodes(g1) == {"pub-0"}
    # globex never lands on acme's dedicated A100s, even while they stand idle
    assert g2.state == JobState.QUEUED and g2.reason
    assert g3.state == JobState.REJECTED and "A100-80G" in g3.reason
    assert cpu.state == JobState.QUEUED and "dedicated to other tenants" in cpu.reason
    assert not g2.allocations.exists() and not cpu.allocations.exists()
    # acme uses its pool; the placement names the card's real model
    assert a1.state == JobState.STARTING and _nodes(a1) == {"sec-0"}
    admitted = a1.decisions.get(kind="admitted")
    assert {g["model"] for p in admitted.placement for g in p["gpus"]} == {"A100-80G"}


def test_sharing_a_pool_again_opens_it_to_everyone(world: Any, cluster: Any, secure: Any) -> None:
    # 4 whole GPUs can never fit on globex's side (2 L4s): a clear "no" rather than a queue
    never = submit(world, cluster, "never", side="b", group={"gpu_count": 4})
    fill = submit(world, cluster, "fill", side="b")
    big = submit(world, cluster, "big", side="b", group={"gpu_count": 2})
    never, fill, big = _cycle(cluster, never, fill, big)
    assert never.state == JobState.REJECTED and "the largest node has 2" in never.reason
    assert fill.state == JobState.STARTING and big.state == JobState.QUEUED
    services.nodepool_update(actor=world.admin, pool=secure, dedicated=False, tenants=[])
    (big,) = _cycle(cluster, big)
    assert big.state == JobState.STARTING and _nodes(big) == {"sec-0"}
    assert AuditEvent.objects.filter(action="nodepool.updated").count() == 1


def test_pools_over_the_api(world: Any, cluster: Any) -> None:
    admin = client_for(world.admin)
    bad = admin.post("/api/v1/pools/", {"cluster": "pools", "name": "x", "dedicated": True,
                                        "selector": {"tier": "secure"}}, format="json")
    assert bad.status_code == 400 and "tenants" in bad.json()
    r = admin.post("/api/v1/pools/", {"cluster": "pools", "name": "secure", "dedicated": True,
                                      "selector": {"tier": "secure"}, "tenants": ["acme"]},
                   format="json")
    assert r.status_code == 201, r.content
    assert r.json()["nodes"] == ["sec-0"]
    pool_id = r.json()["id"]
    node = client_for(world.a.member).get("/api/v1/nodes/?pool=secure").json()["results"]
    assert [n["name"] for n in node] == ["sec-0"]

    mine = client_for(world.a.member).get(f"/api/v1/pools/{pool_id}/")
    assert mine.status_code == 200 and mine.json()["tenants"] == ["acme"]
    theirs = client_for(world.b.member)
    assert theirs.get(f"/api/v1/pools/{pool_id}/").status_code == 404
    assert theirs.get("/api/v1/pools/").json()["results"] == []
    assert client_for(world.a.owner).post(
        "/api/v1/pools/", {"cluster": "pools", "name": "y", "selector": {}},
        format="json").status_code == 403
    assert admin.delete(f"/api/v1/pools/{pool_id}/").status_code == 204
    assert Node.objects.get(name="sec-0").pool == ""


def test_console_shows_pools_without_naming_foreign_tenants(world: Any, cluster: Any,
                                                             secure: Any) -> None:
    own = client_for(world.a.owner).get("/scheduling/clusters/pools/nodes/").content.decode()
    assert "dedicated to acme" in own and "pool secure (dedicated)" in own
    other = client_for(world.b.member).get("/scheduling/clusters/pools/nodes/").content.decode()
    assert "secure" not in other and "dedicated to another tenant" in other


def test_node_list_never_names_a_dedicated_pool_to_other_tenants(world: Any, cluster: Any,
                                                                  secure: Any) -> None:
    sec = Node.objects.get(name="sec-0")
    theirs = client_for(world.b.member)
    listing = theirs.get("/api/v1/nodes/")
    assert listing.status_code == 200
    rows = {n["name"]: n for n in listing.json()["results"]}
    # the node stays visible (infrastructure), but neither its pool nor its selector labels
    assert rows["sec-0"]["pool"] == "" and "tier" not in rows["sec-0"]["labels"]
    assert rows["pub-0"]["labels"] == {**rows["pub-0"]["labels"], "tier": "public"}
    assert "secure" not in listing.content.decode()
    detail = theirs.get(f"/api/v1/nodes/{sec.pk}/")
    assert detail.status_code == 200 and "secure" not in detail.content.decode()
    # probing by name answers exactly like a pool that does not exist
    probe = theirs.get("/api/v1/nodes/?pool=secure")
    assert probe.status_code == 200 and probe.json()["results"] == []
    assert theirs.get("/api/v1/nodes/?pool=no-such-pool").json()["results"] == []

    # its own tenant and platform admins see it all
    for user in (world.a.member, world.admin):
        mine = client_for(user).get("/api/v1/nodes/?pool=secure").json()["results"]
        assert [(n["name"], n["pool"], n["labels"].get("tier")) for n in mine] == [
            ("sec-0", "secure", "secure")]
