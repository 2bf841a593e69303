"""Setting the quotas across all clusters (issue 16's platform level): the GPU memory limits
per GPU model class and the GPU guarantee beside the GPU limit — validation
with field-named errors, the API's nested list, the console form and pages, the audit, and
who may set them."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from scheduling import services as scheduling_services
from tenants import services
from tenants.models import AuditEvent, Quota, QuotaScope
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
    assert body["gpus_guaranteed_all_clusters"] == "6.00" and body["gpus_limit_all_clusters"] == "10.00"
    assert body[FIELD] == [{"model_class": "A100-80G", "gpu_memory_mib_limit": 327680}]
    assert admin.get(f"/api/v1/quotas/{body['id']}/").json()[FIELD] == body[FIELD]
    event = AuditEvent.objects.filter(action="quota.created").latest("id")
    assert event.after is not None
    assert event.after[FIELD] == {"A100-80G": 327680}
    assert event.after["gpus_guaranteed_all_clusters"] == "6.00"
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
    assert b"GPUs guaranteed across all clusters" in page.content
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


G = "gpus_guaranteed_all_clusters"


def test_guarantee_across_all_clusters_rules_name_the_field(world: World, east: Any) -> None:
    assert set(_errors(world, "tenant", **{G: Decimal(-1)})) == {G}
    above_limit = _errors(world, "tenant", **{G: Decimal(6), "gpus_limit_all_clusters": Decimal(4)})
    assert set(above_limit) == {G} and "GPU limit across all clusters (4" in above_limit[G][0]
    # A project's needs its tenant's (a tenant without one guarantees none across all clusters).
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(0)})
    none = _errors(world, "project", **{G: Decimal(2)})
    assert set(none) == {G} and "The tenant guarantees 0 GPUs across all clusters" in none[G][0]
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant, values={G: Decimal(4)})
    services.quota_set(actor=world.a.owner, scope="project", project=world.a.project, values={G: Decimal(3)})
    # The projects' together within the tenant's: 3 + 2 > 4.
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.a.owner, scope="project", project=world.a.other_project,
                           values={G: Decimal(2)})
    assert set(exc.value.message_dict) == {G} and "guaranteed 5" in exc.value.message_dict[G][0]
    # The tenant's not below its projects', nor dropped while they have one.
    below = _errors(world, "tenant", **{G: Decimal(2)})
    assert set(below) == {G} and "3" in below[G][0]
    assert set(_errors(world, "tenant", **{G: None})) == {G}
    # Cluster quotas have none.
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope="cluster", cluster=east, values={G: Decimal(1)})
    assert set(exc.value.message_dict) == {G}


def test_guarantee_across_all_clusters_api_audit_permissions_and_pages(world: World, east: Any) -> None:
    admin = client_for(world.admin)
    tenant_q = admin.post("/api/v1/quotas/", {**BODY, "scope": "tenant", "tenant": world.a.tenant.pk,
                                              "gpus_guaranteed": "0", G: "4"}, format="json")
    assert tenant_q.status_code == 201 and tenant_q.json()[G] == "4.00"
    bad = admin.patch(f"/api/v1/quotas/{tenant_q.json()['id']}/", {G: "-2"}, format="json")
    assert bad.status_code == 400 and set(bad.json()) == {G}
    # The tenant's owner may not change the tenant's quota; sets its project's within it.
    owner = client_for(world.a.owner)
    assert owner.patch(f"/api/v1/quotas/{tenant_q.json()['id']}/", {G: "8"},
                       format="json").status_code == 403
    over = owner.post("/api/v1/quotas/", {**BODY, "scope": "project", "project": world.a.project.pk,
                                          "gpus_guaranteed": "0", G: "5"}, format="json")
    assert over.status_code == 400 and set(over.json()) == {G}
    proj = owner.post("/api/v1/quotas/", {**BODY, "scope": "project", "project": world.a.project.pk,
                                          "gpus_guaranteed": "0", G: "4"}, format="json")
    assert proj.status_code == 201, proj.json()
    event = AuditEvent.objects.filter(action="quota.created").latest("id")
    assert event.after is not None and event.after[G] == "4.00"
    changed = owner.patch(f"/api/v1/quotas/{proj.json()['id']}/", {G: "3"}, format="json")
    assert changed.status_code == 200
    event = AuditEvent.objects.filter(action="quota.updated").latest("id")
    assert event.before is not None and event.after is not None
    assert (event.before[G], event.after[G]) == ("4.00", "3.00")
    # A project member may not; another tenant's owner does not even see it.
    assert client_for(world.a.member).patch(f"/api/v1/quotas/{proj.json()['id']}/", {G: "1"},
                                            format="json").status_code in (403, 404)
    assert client_for(world.b.owner).patch(f"/api/v1/quotas/{proj.json()['id']}/", {G: "1"},
                                           format="json").status_code == 404
    with pytest.raises(PermissionDenied):
        services.quota_set(actor=world.b.owner, scope="project", project=world.a.project, values={G: 1})
    assert Quota.objects.get(project=world.a.project).gpus_guaranteed_all_clusters == 3
    # The project page: the guarantee, and how it is split between the clusters now (one
    # cluster, nothing held: all of it on east).
    html = login(world.a.owner).get("/t/acme/p/acme-p1/").content.decode()
    assert "Across all clusters" in html and "3.00" in html
    assert "Guarantee split by cluster" in html and "<td>east</td><td>3.0</td>" in html
    # The console form saves it, and a bad value is a field error.
    client = login(world.a.owner)
    bad_form = client.post("/t/acme/p/acme-p1/quota/", {**FORM, G: "9"})
    assert bad_form.status_code == 200 and G in bad_form.context["form"].errors
    ok = client.post("/t/acme/p/acme-p1/quota/", {**FORM, G: "2"})
    assert ok.status_code == 302
    assert Quota.objects.get(project=world.a.project).gpus_guaranteed_all_clusters == 2


# Review of r6-gg: each failed before its fix.
GG = "gpus_guaranteed_all_clusters"


def test_per_cluster_and_all_cluster_tenant_guarantees_together_stay_within_the_platform(world: Any) -> None:
    east = scheduling_services.cluster_create(actor=world.admin, name="east", backend="simulated",
                                              inventory=EAST)
    services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                       values={"gpus_guaranteed": Decimal(8)})
    for t in (world.a.tenant, world.b.tenant):
        Quota.objects.filter(scope=QuotaScope.TENANT, tenant=t).delete()
        Quota.objects.filter(scope=QuotaScope.PROJECT, tenant=t).delete()
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(8)})
    # The platform guarantees 8 GPUs (one cluster); tenant a already has all 8 of them.
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                           values={"gpus_guaranteed": Decimal(0), GG: Decimal(8)})
    assert GG in exc.value.message_dict
    # Raising the per-cluster guarantee of a tenant whose guarantee across all clusters takes
    # the rest: the per-cluster field is the one named.
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(4)})
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                       values={"gpus_guaranteed": Decimal(0), GG: Decimal(4)})
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                           values={"gpus_guaranteed": Decimal(6)})
    errors = exc.value.message_dict
    assert GG not in errors and "would be guaranteed 10.00 in all" in errors["gpus_guaranteed"][0]


def test_a_guarantee_per_cluster_plus_across_all_clusters_stays_within_its_limit_there(world: Any) -> None:
    scheduling_services.cluster_create(actor=world.admin, name="east", backend="simulated", inventory=EAST)
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(4), GG: Decimal(4)})
    # g=4 per cluster + G=4 across all clusters, but at most 4 GPUs across all clusters: the
    # guarantee on any one cluster (g + part = 8) can never be held.
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope="project", project=world.a.project,
                           values={"gpus_guaranteed": Decimal(4), GG: Decimal(4),
                                   "gpus_limit_all_clusters": Decimal(4)})
    assert GG in exc.value.message_dict or "gpus_limit_all_clusters" in exc.value.message_dict


def test_two_clusters_per_cluster_g_on_each_plus_G_overcommit(world: Any) -> None:
    """Two clusters each guaranteeing 8 (16 in all). Tenant a: per-cluster g=8 — which the engine
    applies on EACH cluster (8 + 8 = 16 GPUs guaranteed). Tenant b: G=8 across all clusters
    would make 24 guaranteed on 16: refused, the field named."""
    from .scheduling.test_all_cluster_quotas import EAST2

    for name, inv in (("east", EAST), ("east2", EAST2)):
        c = scheduling_services.cluster_create(actor=world.admin, name=name, backend="simulated",
                                               inventory=inv)
        services.quota_set(actor=world.admin, scope="cluster", cluster=c,
                           values={"gpus_guaranteed": Decimal(8)})
    for t in (world.a.tenant, world.b.tenant):
        Quota.objects.filter(scope=QuotaScope.PROJECT, tenant=t).delete()
        Quota.objects.filter(scope=QuotaScope.TENANT, tenant=t).delete()
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(8)})
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                           values={"gpus_guaranteed": Decimal(0), GG: Decimal(8)})
    assert "would be guaranteed 24.00 in all" in exc.value.message_dict[GG][0]
    # With a per-cluster guarantee of 4, each cluster has 4 left: 8 across all clusters fit.
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(4)})
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                       values={"gpus_guaranteed": Decimal(0), GG: Decimal(8)})


def test_a_project_guarantee_across_all_clusters_without_a_tenant_quota_is_refused(world: Any) -> None:
    """Tenant a has no tenant quota: it guarantees 0 across all clusters, so its owner cannot
    give its project G=1000 (bounded by neither the tenant nor the platform)."""
    c = scheduling_services.cluster_create(actor=world.admin, name="east", backend="simulated",
                                           inventory=EAST)
    services.quota_set(actor=world.admin, scope="cluster", cluster=c, values={"gpus_guaranteed": Decimal(8)})
    Quota.objects.filter(scope=QuotaScope.PROJECT, tenant=world.a.tenant).delete()
    Quota.objects.filter(scope=QuotaScope.TENANT, tenant=world.a.tenant).delete()
    with pytest.raises(ValidationError) as exc:
        services.quota_set(actor=world.a.owner, scope="project", project=world.a.project,
                           values={"gpus_guaranteed": Decimal(0), GG: Decimal(1000)})
    assert "guarantees 0 GPUs across all clusters" in exc.value.message_dict[GG][0]
    assert not Quota.objects.filter(project=world.a.project).exists()


def test_a_limit_across_clusters_below_the_per_cluster_guarantee_says_what_to_raise(world: Any) -> None:
    """Review rv finding 10: the guarantee's error read "at most -4.00" when the limit across all
    clusters was below the per-cluster guarantee itself; now it names the conflict and the field
    to raise first (API and console form alike)."""
    east = scheduling_services.cluster_create(actor=world.admin, name="east", backend="simulated",
                                              inventory=EAST)
    services.quota_set(actor=world.admin, scope="cluster", cluster=east,
                       values={"gpus_guaranteed": Decimal(8)})
    admin = client_for(world.admin)
    tenant_q = admin.post("/api/v1/quotas/", {**BODY, "scope": "tenant", "tenant": world.a.tenant.pk,
                                              "gpus_guaranteed": "6"}, format="json")
    assert tenant_q.status_code == 201, tenant_q.content
    bad = admin.patch(f"/api/v1/quotas/{tenant_q.json()['id']}/",
                      {"gpus_limit_all_clusters": "4", GG: "2"}, format="json")
    assert bad.status_code == 400, bad.content
    errors = bad.json()
    assert set(errors) == {GG, "gpus_limit_all_clusters"}
    assert errors[GG] == [
        "The GPU limit across all clusters (4) is below the per-cluster GPU guarantee (6), so no guarantee "
        "across all clusters fits: raise gpus_limit_all_clusters to at least 8 (6 per cluster + 2 across "
        "all clusters) first, or lower gpus_guaranteed."]
    assert errors["gpus_limit_all_clusters"] == [
        "Below the per-cluster GPU guarantee (6): at least that, or lower gpus_guaranteed first."]
    # Room left but too little: the bound is a positive number, with the way out.
    low = admin.patch(f"/api/v1/quotas/{tenant_q.json()['id']}/",
                      {"gpus_limit_all_clusters": "7", GG: "2"}, format="json")
    assert low.status_code == 400 and set(low.json()) == {GG}
    assert "at most 1, or raise gpus_limit_all_clusters first" in low.json()[GG][0]
    # The console form of a project quota shows the same on the field.
    page = login(world.a.owner).post("/t/acme/p/acme-p1/quota/", {
        **FORM, "gpus_guaranteed": "3", "gpus_limit_all_clusters": "2", GG: "1"})
    assert page.status_code == 200
    form_errors = page.context["form"].errors
    assert "raise gpus_limit_all_clusters to at least 4" in form_errors[GG][0]
    assert not any("at most -" in m for m in form_errors[GG])
    assert not Quota.objects.filter(project=world.a.project).exists()
