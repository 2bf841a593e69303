"""Through the service: non-preemptible jobs run within their project's guarantee;
preemptible ones may borrow idle GPUs beyond it (engine rule CycleConfig.nonpreemptible_within_guarantee)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from scheduling import services
from tenants import services as tenant_services
from tests.conftest import World

from .conftest import SMALL_INVENTORY, submit

pytestmark = pytest.mark.django_db


def test_non_preemptible_within_guarantee_preemptible_borrows(world: World) -> None:
    cluster = services.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    services.inventory_sync(cluster=cluster)
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(2), "gpus_limit": Decimal(8)})
    tenant_services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                              values={"gpus_guaranteed": Decimal(2), "gpus_limit": Decimal(8)})
    inside = submit(world, cluster, "inside", group={"gpu_count": 2})
    beyond = submit(world, cluster, "beyond", group={"gpu_count": 1})
    borrower = submit(world, cluster, "borrower", preemptible=True, group={"gpu_count": 2})
    for _ in range(2):
        services.cycle_run(cluster=cluster)
    for job in (inside, beyond, borrower):
        job.refresh_from_db()
    assert inside.state == "starting"
    assert beyond.state == "queued" and "guarantee" in beyond.reason and "preemptible" in beyond.reason
    assert borrower.state == "starting"  # borrows idle GPUs beyond the guarantee


def test_job_env_values_only_for_those_who_may_change_it(world: World) -> None:
    from tests.conftest import client_for

    cluster = services.cluster_create(actor=world.admin, name="sim2", backend="simulated",
                                      inventory=SMALL_INVENTORY)
    job = submit(world, cluster, "secretive", user="project_admin",
                 group={"gpu_count": 1, "env": {"WANDB_API_KEY": "s3cr3t"}})
    member = client_for(world.a.member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert member["groups"][0]["env"] == {"WANDB_API_KEY": "********"}
    owner = client_for(world.a.project_admin).get(f"/api/v1/jobs/{job.pk}/").json()
    assert owner["groups"][0]["env"] == {"WANDB_API_KEY": "s3cr3t"}
