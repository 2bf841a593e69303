"""A tenant owner sees GPU guarantees and limits per cluster and across all clusters in one
view, beside what each cluster can actually give (issue 32, finding 5), and a guarantee above
that is flagged where it is set — the form, the API's answer — and on the admin home (issue
29). A warning, not a refusal: the guarantee is saved as asked (docs/QUOTAS.md)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduling.models import Cluster, GpuDevice
from tenants import services as tenant_services
from tenants.models import Quota
from tests.integration.portal.test_figures_agree import _run, two  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db


def _get(user: Any, url: str) -> str:
    c = Client()
    c.force_login(user)
    r = c.get(url)
    assert r.status_code == 200
    return r.content.decode()


def _row(page: str, where: str) -> str:
    start = page.index(f'<th scope="row">{where}</th>')
    return page[start:page.index("</tr>", start)]


def test_the_owner_sees_per_cluster_and_across_with_what_can_be_given(
        world: Any, two: tuple[Cluster, Cluster]) -> None:  # noqa: F811
    east, west = two
    cards = {c.name: GpuDevice.objects.filter(node__cluster=c).count() for c in two}
    assert cards == {"east": 8, "west": 8}
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.b.tenant,
                              values={"gpus_guaranteed": Decimal(3)})
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(4), "gpus_limit": Decimal(6),
                                      "gpus_guaranteed_all_clusters": Decimal(2),
                                      "gpus_limit_all_clusters": Decimal(10)})
    _run(world, east, "one", gpu_count=1)
    page = _get(world.a.owner, reverse("console:tenant", args=[world.a.tenant.name]))
    # east: 8 cards, 3 guaranteed to the other tenant, 5 can be given, 4 set, limit 6, 1 held
    assert _row(page, "east").split("<td>")[1:] == ["8</td>", "3</td>", "5</td>", "4</td>", "6</td>",
                                                     "1</td>"]
    assert "<td>0</td>" in _row(page, "west")
    # all together: 16 cards; 3 + 4 on each of 2 clusters are taken, 2 can be given, 2 set
    assert _row(page, "all clusters together").split("<td>")[1:] == [
        "16</td>", "14</td>", "2</td>", "2</td>", "10</td>", "1</td>"]
    assert "more than can be given" not in page
    assert world.b.tenant.name not in page  # the other tenant only summed

    # The admin raises the guarantee above what east can give: flagged on the owner's view,
    # the form, and the admin home.
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(6)})
    page = _get(world.a.owner, reverse("console:tenant", args=[world.a.tenant.name]))
    assert "6 <strong class=\"danger guarantee-over\">more than can be given (5)</strong>" \
        in _row(page, "east")
    form = _get(world.admin, reverse("console:tenant-quota", args=[world.a.tenant.name]))
    assert "more than can be given (5)" in form and "Cannot be honoured: Cluster east has 8 GPUs" in form
    assert "Guarantee cannot be honoured: Cluster east has 8 GPUs" in _get(world.admin, "/")


def test_the_owner_edits_a_project_guarantee_and_is_warned_not_refused(
        world: Any, two: tuple[Cluster, Cluster]) -> None:  # noqa: F811
    tenant_services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                              values={"gpus_guaranteed": Decimal(4)})
    c = Client()
    c.force_login(world.a.owner)
    url = reverse("console:project-quota", args=[world.a.tenant.name, world.a.project.name])
    form = c.get(url).content.decode()
    assert "Tenant's guarantee" in form and "Can be guaranteed" in form
    assert _row(form, "east").split("<td>")[1:3] == ["4</td>", "0</td>"]
    fields = {"gpus_guaranteed": "5", "gpus_limit": "6", "gpu_memory_mib_guaranteed": "0",
              "cpu_cores_guaranteed": "0", "ram_mib_guaranteed": "0"}
    # Within the tenant, more than the tenant's guarantee is refused (the rule the scheduler
    # needs to hold); the view said 4 can be given.
    page = c.post(url, fields).content.decode()
    assert "The tenant guarantees 4.00 GPUs; with this value its children would be guaranteed 5" in page
    r = c.post(url, {**fields, "gpus_guaranteed": "3"}, follow=True)
    page = r.content.decode()
    assert Quota.objects.get(project=world.a.project).gpus_guaranteed == Decimal(3)
    assert _row(page, "east").split("<td>")[1:5] == ["4</td>", "0</td>", "4</td>", "3</td>"]

    # Above what the clusters have: saved as asked, and the API's answer says so.
    admin = Client()
    admin.force_login(world.admin)
    quota = Quota.objects.get(tenant=world.a.tenant, scope="tenant")
    r = admin.patch(f"/api/v1/quotas/{quota.pk}/", {"gpus_guaranteed": "9"}, content_type="application/json")
    assert r.status_code == 200, r.content
    assert r.json()["gpus_guaranteed"] == "9.00"
    assert r.json()["guarantee_warnings"] == [
        "Cluster east has 8 GPUs; the tenants' guarantees there add up to 9 GPUs (each tenant's "
        "per-cluster guarantee applies on every cluster).",
        "Cluster west has 8 GPUs; the tenants' guarantees there add up to 9 GPUs (each tenant's "
        "per-cluster guarantee applies on every cluster)."]
    # The owner reading the project's quota is told too.
    mine = Quota.objects.get(project=world.a.project)
    assert len(c.get(f"/api/v1/quotas/{mine.pk}/").json()["guarantee_warnings"]) == 2
    r = admin.patch(f"/api/v1/quotas/{quota.pk}/", {"gpus_guaranteed": "8"}, content_type="application/json")
    assert r.json()["guarantee_warnings"] == []
