"""Clusters read by their display name wherever users read them (issue 32, finding 10:
`sim` on one page, "Simulated cluster" on the next): lists, workload pages, the launch form's
preset cards and the home. The short name stays in URLs and filters (an identifier)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from registry.models import Image
from scheduling import services as scheduling
from tests.integration.scheduling.conftest import SMALL_INVENTORY, submit
from workspaces import services

pytestmark = pytest.mark.django_db

NAME, DISPLAY = "sim-x", "Simulated cluster X"


def test_pages_name_the_cluster_by_its_display_name(world: Any) -> None:
    cluster = scheduling.cluster_create(actor=world.admin, name=NAME, display_name=DISPLAY,
                                        backend="simulated", inventory=SMALL_INVENTORY)
    scheduling.inventory_sync(cluster=cluster)
    # a second cluster: the preset cards name each cluster only when there are several
    other = scheduling.cluster_create(actor=world.admin, name="sim-y", display_name="Simulated cluster Y",
                                      backend="simulated", inventory=SMALL_INVENTORY)
    scheduling.inventory_sync(cluster=other)
    job = submit(world, cluster=cluster, name="plain")
    env, *_ = services.environment_launch(
        actor=world.a.member, project=world.a.project, cluster=cluster, name="nb", kind="jupyter",
        image=Image.objects.get(name="pytorch-jupyter"), gpu_count=1, gpu_memory_mib=1024,
        gpu_cores_percent=10, cpu_millicores=500, ram_mib=1024)
    c = Client()
    c.force_login(world.a.member)
    for url in ("/scheduling/jobs/", f"/scheduling/jobs/{job.pk}/", f"/workspaces/environments/{env.pk}/",
                "/workspaces/environments/new/", "/scheduling/clusters/"):
        r = c.get(url)
        assert r.status_code == 200, url
        page = r.content.decode()
        assert DISPLAY in page, url
        # the short name only inside URLs and form values, never as text a user reads
        text = re.sub(r"<[^>]+>", " ", page)
        seen = re.findall(rf".{{0,40}}(?<![\w-]){NAME}(?![\w-]).{{0,40}}", text)
        assert not seen, (url, seen)


def test_quota_by_cluster_names_clusters_by_display_name(world: Any) -> None:
    from decimal import Decimal

    from tenants import services as tenant_services

    cluster = scheduling.cluster_create(actor=world.admin, name=NAME, display_name=DISPLAY,
                                        backend="simulated", inventory=SMALL_INVENTORY)
    scheduling.inventory_sync(cluster=cluster)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(2), "gpus_limit": Decimal(4)})
    c = Client()
    c.force_login(world.a.owner)
    page = c.get(f"/t/{world.a.tenant.name}/").content.decode()
    assert f'<th scope="row">{DISPLAY}</th>' in page
    assert f'<th scope="row">{NAME}</th>' not in page


def test_scheduler_reasons_name_the_cluster_by_its_display_name(world: Any) -> None:
    """The scheduler's own words (a refusal at submit, why a closed cluster takes no work) use
    the name the pages use, not the identifier."""
    from django.core.exceptions import ValidationError

    from scheduling.services.clusters import cluster_closed_why

    cluster = scheduling.cluster_create(actor=world.admin, name=NAME, display_name=DISPLAY,
                                        backend="simulated", inventory=SMALL_INVENTORY)
    scheduling.inventory_sync(cluster=cluster)
    with pytest.raises(ValidationError) as refused:
        submit(world, cluster=cluster, name="nowhere", group={"gpu_models": ["B200"]})
    assert f"No node of cluster {DISPLAY} has a GPU of model B200" in str(refused.value)
    cluster.enabled = False
    why = cluster_closed_why(cluster)
    assert why is not None and why.pinned.startswith(f"Cluster {DISPLAY} is disabled")
