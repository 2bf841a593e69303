"""The portal's model-service pages (issue 15, issue 19's patterns): a launch form with presets
(a slice of a named card), the list (replicas ready/wanted, load, revision, endpoint, events:
scaled, preempted whom — named only where the reader may see the victim), the detail page and
its scale form; every write goes through the services (permission check, audit)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from registry.models import Image
from scheduling import services as scheduling
from scheduling.models import DecisionKind, Job, JobState, SchedulingDecision
from tenants import services as tenant_services
from tenants.models import AuditEvent, Role
from tests.conftest import make_user
from tests.integration.scheduling.conftest import gpu_group
from workspaces import services
from workspaces.models import ModelService

from .conftest import advance
from .test_serving import ONE_NODE

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def setup(world: Any) -> dict[str, Any]:
    cluster = scheduling.cluster_create(actor=world.admin, name="sim", backend="simulated",
                                        inventory=ONE_NODE)
    scheduling.inventory_sync(cluster=cluster)
    quarter = services.profile_create(
        actor=world.admin, name="a100-quarter", display_name="¼ A100 · 20 GB", gpu_model="A100-80G",
        gpu_count=1, gpu_memory_mib=20480, gpu_cores_percent=25, cpu_millicores=2000, ram_mib=8192)
    return {"cluster": cluster, "quarter": quarter}


def _form(world: Any, setup: dict[str, Any], **kw: Any) -> dict[str, Any]:
    """What the browser sends: the form's visible choices plus its pre-filled fields."""
    data = {"project": world.a.project.pk, "cluster": "sim", "name": "chat",
            "profile": setup["quarter"].pk, "image": Image.objects.get(name="vllm").pk,
            "model_source_kind": "uri", "model_source": "hf://Qwen/Qwen2.5-7B-Instruct",
            "min_replicas": 1, "max_replicas": 3, "autoscale_metric": "concurrency",
            "autoscale_target": 8, "port": 8000, "health_path": "/health", "gpu_count": 1,
            "gpu_memory_mib": 20480, "gpu_cores_percent": 30, "cpu_millicores": 2000, "ram_mib": 16384,
            "scale_down_delay_seconds": 300, "priority_class": "inference"}
    data.update(kw)
    return data


def test_member_launches_a_service_with_a_preset(world: Any, setup: dict[str, Any]) -> None:
    member = _client(world.a.member)
    page = member.get("/workspaces/services/new/").content.decode()
    assert "¼ of an A100-80G" in page  # the preset card names the slice as a share of the card
    r = member.post("/workspaces/services/new/", _form(world, setup))
    svc = ModelService.objects.get()
    assert r.status_code == 302 and r["Location"] == f"/workspaces/services/{svc.pk}/"
    # the preset's shape replaced the custom fields (25 %, not the form's 30 %)
    assert (svc.gpu_memory_mib, svc.gpu_cores_percent, svc.gpu_models, svc.owner) == (
        20480, 25, ["A100-80G"], world.a.member)
    created = AuditEvent.objects.get(action="service.created", target_id=str(svc.pk))
    assert created.actor == world.a.member and created.after["preset"] == "a100-quarter"
    detail = member.get(r["Location"]).content.decode()
    assert "¼ of an A100-80G" in detail and f"svc-{svc.pk}-chat." in detail


def test_a_bad_field_is_named_next_to_it(world: Any, setup: dict[str, Any]) -> None:
    r = _client(world.a.member).post("/workspaces/services/new/",
                                     _form(world, setup, name="Not A Name", min_replicas=4, max_replicas=2))
    assert r.status_code == 200 and not ModelService.objects.exists()
    form = r.context["form"]
    assert form.errors  # the service's errors land on the fields it names
    assert set(form.errors) & {"name", "min_replicas", "max_replicas"}


def test_list_shows_scaling_and_whom_a_replica_preempted(world: Any, setup: dict[str, Any]) -> None:
    cluster = setup["cluster"]
    member = _client(world.a.member)
    member.post("/workspaces/services/new/", _form(world, setup))
    svc = ModelService.objects.get()
    advance(cluster)
    # another tenant's batch training fills what the first replica leaves
    b = world.b.member
    for name, group in (("pretrain", gpu_group(gpu_count=1)),
                        ("finetune", gpu_group(gpu_count=1, gpu_memory_mib=61440, gpu_cores_percent=75))):
        scheduling.job_submit(actor=b, project=world.b.project, cluster=cluster, name=name, groups=[group],
                              priority_class="batch")
    advance(cluster)
    assert Job.objects.filter(project=world.b.project, state=JobState.RUNNING).count() == 2
    r = member.post(f"/workspaces/services/{svc.pk}/scale/", {"replicas": 2})
    assert r.status_code == 302
    svc.refresh_from_db()
    assert (svc.desired_replicas, svc.min_replicas, svc.max_replicas) == (2, 2, 2)
    assert AuditEvent.objects.filter(action="service.scaled", actor=world.a.member).exists()
    advance(cluster, rounds=4)
    assert SchedulingDecision.objects.filter(kind=DecisionKind.PREEMPTING,
                                             job__service_replica__service=svc).exists()

    row = _row(member.get("/workspaces/services/").content.decode(), svc.pk)
    text = re.sub(r"<[^>]+>", "", row)  # the counts are live fields (spans)
    assert "2 / 2" in text and "(2–2)" in text
    assert "Scaled up 1 → 2 by acme-member" in row
    assert "Replica 2 preempted 1 job you cannot see" in row  # the victim is globex's
    assert f"http://svc-{svc.pk}-chat." in row and "data-copy=" in row
    # a platform admin sees whom
    admin_row = _row(_client(world.admin).get("/workspaces/services/").content.decode(), svc.pk)
    assert "Replica 2 preempted pretrain" in admin_row or "Replica 2 preempted finetune" in admin_row


def _row(html: str, pk: int) -> str:
    start = html.index(f'data-service="{pk}"')
    return html[start:html.index("</tr>", start)]


def test_other_tenants_and_other_members_cannot_change_it(world: Any, setup: dict[str, Any]) -> None:
    _client(world.a.member).post("/workspaces/services/new/", _form(world, setup))
    svc = ModelService.objects.get()
    outsider = _client(world.b.member)
    assert "chat" not in outsider.get("/workspaces/services/").content.decode()
    assert outsider.get(f"/workspaces/services/{svc.pk}/").status_code == 404
    assert outsider.post(f"/workspaces/services/{svc.pk}/scale/", {"replicas": 3}).status_code == 404
    # a member of the same project sees it, but only its owner (or a project admin) scales it
    colleague = make_user("acme-colleague")
    tenant_services.membership_create(actor=world.a.owner, user=colleague, tenant=world.a.tenant,
                                      project=world.a.project, role=Role.PROJECT_MEMBER)
    c = _client(colleague)
    page = c.get(f"/workspaces/services/{svc.pk}/").content.decode()
    assert "chat" in page and "service-scale" not in page and "/scale/" not in page
    assert c.post(f"/workspaces/services/{svc.pk}/scale/", {"replicas": 3}).status_code == 403
    assert c.post(f"/workspaces/services/{svc.pk}/delete/").status_code == 403
    svc.refresh_from_db()
    assert svc.desired_replicas == 1
    assert not AuditEvent.objects.filter(action__in=["service.scaled", "service.deleted"]).exists()
    # the project admin may
    r = _client(world.a.project_admin).post(f"/workspaces/services/{svc.pk}/scale/",
                                            {"min_replicas": 1, "max_replicas": 3})
    assert r.status_code == 302
    svc.refresh_from_db()
    assert svc.max_replicas == 3


def test_home_and_nav_show_services(world: Any, setup: dict[str, Any]) -> None:
    member = _client(world.a.member)
    member.post("/workspaces/services/new/", _form(world, setup))
    advance(setup["cluster"])
    home = member.get("/").content.decode()
    assert 'href="/workspaces/services/"' in home  # the nav
    assert "Launch a model service" in home
    svc = ModelService.objects.get()
    assert f'href="/workspaces/services/{svc.pk}/"' in home and "1 of 1 replicas ready" in home


def test_the_list_costs_the_same_queries_for_2_or_12_services_and_keeps_each_ones_events(
        world: Any, setup: dict[str, Any]) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def make(n: int) -> None:
        for i in range(n):
            services.model_service_create(
                actor=world.a.member, project=world.a.project, cluster=setup["cluster"],
                name=f"m{ModelService.objects.count()}-{i}", image=Image.objects.get(name="vllm"),
                model_source_kind="uri", model_source="hf://Qwen/Qwen2.5-0.5B", min_replicas=0,
                max_replicas=2, scale_to_zero_seconds=600, gpu_memory_mib=1024, gpu_cores_percent=5)

    admin = _client(world.admin)
    make(2)
    with CaptureQueriesContext(connection) as two:
        assert admin.get("/workspaces/services/").status_code == 200
    make(10)
    with CaptureQueriesContext(connection) as twelve:
        assert admin.get("/workspaces/services/").status_code == 200
    assert len(twelve) == len(two)
    # a busy service's many scalings do not push a quiet one's events off the page
    busy, quiet = ModelService.objects.order_by("pk")[:2]
    for n in range(12):
        services.model_service_scale(actor=world.a.member, service=busy, replicas=n % 2 + 1)
    html = admin.get("/workspaces/services/").content.decode()
    assert "Created by acme-member" in _row(html, quiet.pk)
    assert "Scaled" in _row(html, busy.pk)
    # two tenants' services of one name have distinct copy fields
    assert html.count(f'id="endpoint-{busy.pk}"') == 1


def test_a_second_delete_of_one_service_is_a_404_not_a_500(world: Any, setup: dict[str, Any]) -> None:
    member = _client(world.a.member)
    member.post("/workspaces/services/new/", _form(world, setup))
    svc = ModelService.objects.get()
    stale = ModelService.objects.get(pk=svc.pk)
    services.model_service_delete(actor=world.a.member, service=svc)
    from django.http import Http404
    with pytest.raises(Http404):
        services.model_service_delete(actor=world.a.member, service=stale)
    with pytest.raises(Http404):
        services.model_service_scale(actor=world.a.member, service=stale, replicas=2)
    assert member.post(f"/workspaces/services/{svc.pk}/delete/").status_code == 404


def test_home_lists_only_services_the_owner_may_still_see(world: Any, setup: dict[str, Any]) -> None:
    from tenants.models import Membership

    member = _client(world.a.member)
    member.post("/workspaces/services/new/", _form(world, setup))
    svc = ModelService.objects.get()
    assert f'href="/workspaces/services/{svc.pk}/"' in member.get("/").content.decode()
    Membership.objects.filter(user=world.a.member, project=world.a.project).delete()
    assert f'href="/workspaces/services/{svc.pk}/"' not in member.get("/").content.decode()
