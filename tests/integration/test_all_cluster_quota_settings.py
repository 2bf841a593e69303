"""Setting the quotas across all clusters (issue 16's platform level): the GPU memory limits
per GPU model class beside the GPU limit (no GPU guarantee across all clusters) — validation
with field-named errors, the API's nested list, the console form and pages, the audit, and
who may set them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from scheduling import services as scheduling_services
from tenants import services
from tenants.models import AuditEvent, Quota
from tests.conftest import World, client_for

from .scheduling.test_multicluster import EAST
from .test_console import login

pytestmark = pytest.mark.django_db

BODY = {"gpu_memory_mib_guaranteed": 0, "cpu_cores_guaranteed": "0", "ram_mib_guaranteed": 0}
FIELD = "gpu_memory_mib_limits_all_clusters"


@pytest.fixture
def east(world: World) -> Any:
    c = scheduling_services.cluster_create(actor=world.admin, name="east", backend="simulated",
                                           inventory=EAST)
    scheduling_services.inventory_sync(cluster=c)
    return c


def _errors(world: World, scope: str, **values: Any) -> dict[str, list[str]]:
    target = {"project": world.a.project} if scope == "project" else {"tenant": world.a.tenant}
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope=scope, values=values, **target)
    return exc.value.message_dict


def test_class_memory_limit_rules(world: World, east: Any) -> None:
    unknown = _errors(world, "tenant", **{FIELD: {"B200": 1024}})
    assert set(unknown) == {FIELD} and "A100-80G" in unknown[FIELD][0]  # names the known classes
    assert "MiB" in _errors(world, "tenant", **{FIELD: {"A100-80G": -5}})[FIELD][0]
    assert FIELD in _errors(world, "tenant", **{FIELD: ["A100-80G"]})
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={FIELD: {"A100-80G": 163840}})
    above = _errors(world, "project", **{FIELD: {"A100-80G": 200000}})
    assert "163840" in above[FIELD][0]
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                       values={FIELD: {"A100-80G": 81920}})
    below = _errors(world, "tenant", **{FIELD: {"A100-80G": 40960}})
    assert "81920" in below[FIELD][0]
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope="cluster", cluster=east, values={FIELD: {"A100-80G": 1}})
    assert set(exc.value.message_dict) == {FIELD}


def test_api_round_trip_audit_and_permissions(world: World, east: Any) -> None:
    admin = client_for(world.admin)
    created = admin.post("/api/v1/quotas/", {
        **BODY, "scope": "tenant", "tenant": world.a.tenant.pk, "gpus_guaranteed": "2",
        "gpus_guaranteed_all_clusters": "6", "gpus_limit_all_clusters": "10",
        FIELD: [{"model_class": "A100-80G", "gpu_memory_mib_limit": 327680}]}, format="json")
    assert created.status_code == 201, created.json()
    body = created.json()
    # No GPU guarantee across all clusters (not built): the field is neither kept nor shown.
    assert "gpus_guaranteed_all_clusters" not in body and body["gpus_limit_all_clusters"] == "10.00"
    assert body[FIELD] == [{"model_class": "A100-80G", "gpu_memory_mib_limit": 327680}]
    assert admin.get(f"/api/v1/quotas/{body['id']}/").json()[FIELD] == body[FIELD]
    event = AuditEvent.objects.filter(action="quota.created").latest("id")
    assert event.after is not None
    assert event.after[FIELD] == {"A100-80G": 327680}
    assert "gpus_guaranteed_all_clusters" not in event.after
    # Field-named 400s: a duplicate class, an unknown one, a negative amount.
    dup = admin.patch(f"/api/v1/quotas/{body['id']}/", {FIELD: [
        {"model_class": "A100-80G", "gpu_memory_mib_limit": 1},
        {"model_class": "A100-80G", "gpu_memory_mib_limit": 2}]}, format="json")
    assert dup.status_code == 400 and set(dup.json()) == {FIELD}
    bad = admin.patch(f"/api/v1/quotas/{body['id']}/", {FIELD: [
        {"model_class": "Z9", "gpu_memory_mib_limit": 1}]}, format="json")
    assert bad.status_code == 400 and "Z9" in bad.json()[FIELD][0]
    neg = admin.patch(f"/api/v1/quotas/{body['id']}/", {"gpus_limit_all_clusters": "-1"}, format="json")
    assert neg.status_code == 400 and set(neg.json()) == {"gpus_limit_all_clusters"}
    # The tenant's owner may not change the tenant's quota (platform admins do), but splits it.
    owner = client_for(world.a.owner)
    denied = owner.patch(f"/api/v1/quotas/{body['id']}/", {"gpus_limit_all_clusters": "9"},
                         format="json")
    assert denied.status_code == 403
    project = owner.post("/api/v1/quotas/", {
        **BODY, "scope": "project", "project": world.a.project.pk, "gpus_guaranteed": "1",
        "gpus_limit_all_clusters": "4",
        FIELD: [{"model_class": "A100-80G", "gpu_memory_mib_limit": 163840}]}, format="json")
    assert project.status_code == 201, project.json()
    updated = admin.patch(f"/api/v1/quotas/{body['id']}/", {FIELD: []}, format="json")
    assert updated.status_code == 200 and updated.json()[FIELD] == []
    event = AuditEvent.objects.filter(action="quota.updated").latest("id")
    assert event.before is not None and event.after is not None
    assert event.before[FIELD] == {"A100-80G": 327680} and event.after[FIELD] == {}
    # A project member may set none of it.
    member = client_for(world.a.member)
    assert member.patch(f"/api/v1/quotas/{project.json()['id']}/", {"gpus_limit_all_clusters": "5"},
                        format="json").status_code in (403, 404)
    with pytest.raises(PermissionDenied):
        services.quota_set(actor=world.a.member, scope="project", project=world.a.project,
                           values={FIELD: {"A100-80G": 1}})
    assert Quota.objects.get(project=world.a.project).gpus_limit_all_clusters == 4


FORM = {"gpus_guaranteed": "0", "gpu_memory_mib_guaranteed": "0", "cpu_cores_guaranteed": "0",
        "ram_mib_guaranteed": "0"}


def test_console_form_saves_and_the_pages_show_both_levels(world: World, east: Any) -> None:
    client = login(world.a.owner)
    page = client.get("/t/acme/p/acme-p1/quota/")
    assert b"GPU limit across all clusters" in page.content
    assert b"guaranteed across all clusters" not in page.content
    assert b"GPU memory limit per GPU model class across all clusters" in page.content
    garbled = client.post("/t/acme/p/acme-p1/quota/", {**FORM, FIELD: "A100-80G 5"})
    assert garbled.status_code == 200 and FIELD in garbled.context["form"].errors
    unknown = client.post("/t/acme/p/acme-p1/quota/", {**FORM, FIELD: "B200 = 5"})
    assert unknown.status_code == 200 and "A100-80G" in unknown.context["form"].errors[FIELD][0]
    assert not Quota.objects.filter(project=world.a.project).exists()
    ok = client.post("/t/acme/p/acme-p1/quota/", {**FORM, "gpus_limit_all_clusters": "3",
                                                   FIELD: "A100-80G = 163840\n"})
    assert ok.status_code == 302
    q = Quota.objects.get(project=world.a.project)
    assert q.gpus_limit_all_clusters == 3
    assert q.gpu_memory_mib_limits_all_clusters == {"A100-80G": 163840}
    # The form shows the saved map as lines again.
    assert b"A100-80G = 163840" in client.get("/t/acme/p/acme-p1/quota/").content
    # The project page: the per-cluster rows and the rows across all clusters, with usage.
    job = scheduling_services.job_submit(actor=world.a.owner, project=world.a.project, cluster=east,
                                         name="j", groups=[{"name": "w", "replicas": 1, "gpu_count": 1,
                                                            "cpu_millicores": 1000, "ram_mib": 1024}])
    scheduling_services.cycle_run(cluster=east)
    job.refresh_from_db()
    assert job.state == "starting"
    html = client.get("/t/acme/p/acme-p1/").content.decode()
    assert "Across all clusters" in html
    assert "A100-80G GPU memory (MiB)" in html and "163840" in html and "81920" in html
    # The home page's quota left names the class and what is left of it.
    home = client.get("/").content.decode()
    assert "A100-80G: 80 of 160 GiB GPU memory left across all clusters" in home
    assert "2.0 left across all clusters" in home
    # The workload forms' quota left: what is left under the limit across all clusters.
    from django.urls import reverse

    form_page = client.get(reverse("workspaces:training-new")).content.decode()
    assert "Left across all clusters" in form_page
    # The cluster quota's form has none of the fields across all clusters.
    admin = login(world.admin)
    cluster_form = admin.get("/admin/clusters/east/quota/")
    assert cluster_form.status_code == 200 and b"GPUs guaranteed" in cluster_form.content
    assert b"across all clusters" not in cluster_form.content


@pytest.mark.parametrize("amount", ["\u00b2", "9" * 5000])
def test_class_limit_amounts_that_are_not_plain_digits_are_field_errors(world: World, east: Any,
                                                                        amount: str) -> None:
    """'²' passes str.isdigit() but not int(); 5,000 digits pass isdigit() but not int()
    (its 4,300-digit limit): a field error on the form and a 400 on the API, not a 500."""
    client = login(world.a.owner)
    page = client.post("/t/acme/p/acme-p1/quota/", {**FORM, FIELD: f"A100-80G = {amount}"})
    assert page.status_code == 200 and FIELD in page.context["form"].errors
    assert not Quota.objects.filter(project=world.a.project).exists()
    api = client_for(world.a.owner).post("/api/v1/quotas/", {
        **BODY, "scope": "project", "project": world.a.project.pk,
        FIELD: [{"model_class": "A100-80G", "gpu_memory_mib_limit": amount}]}, format="json")
    assert api.status_code == 400 and FIELD in api.json()
    assert not Quota.objects.filter(project=world.a.project).exists()


def test_quota_pages_read_no_usage_across_clusters_without_a_quota_across_clusters(
        world: World, east: Any) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = login(world.a.owner)
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                       values={"gpus_guaranteed": Decimal(0)})
    with CaptureQueriesContext(connection) as q:
        html = client.get("/t/acme/p/acme-p1/").content.decode()
    assert "Across all clusters" not in html
    assert not [x for x in q.captured_queries if "gpuslice" in x["sql"].lower()
                and "group by" in x["sql"].lower()]
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_limit_all_clusters": Decimal(8)})
    assert "Across all clusters" in client.get("/t/acme/").content.decode()
