"""The console: pages render for each role, forms show field errors, foreign pages are 404."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tenants.models import ApiToken, AuditEvent, Membership, Project, Quota
from tests.conftest import PASSWORD, World

pytestmark = pytest.mark.django_db


def login(user: Any) -> Client:
    client = Client()
    response = client.post("/login/", {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302, "login failed"
    return client


def test_login_page_and_redirect_for_anonymous(world: World) -> None:
    client = Client()
    assert client.get("/").status_code == 302
    page = client.get("/login/")
    assert page.status_code == 200 and b'name="password"' in page.content


def test_wrong_password_shows_an_error(world: World) -> None:
    page = Client().post("/login/", {"username": "acme-owner", "password": "nope"})
    assert page.status_code == 200
    assert b"correct username and password" in page.content


def test_home_lists_only_own_tenants(world: World) -> None:
    page = login(world.a.member).get("/")
    assert b"acme" in page.content and b"globex" not in page.content


@pytest.mark.parametrize("role", ["owner", "project_admin", "member"])
def test_foreign_tenant_pages_are_404(world: World, role: str) -> None:
    client = login(getattr(world.a, role))
    assert client.get("/t/globex/").status_code == 404
    assert client.get("/t/globex/p/globex-p1/").status_code == 404
    assert client.get("/t/globex/quota/").status_code == 404
    assert client.get("/admin/tenants/").status_code == 404
    assert client.get("/admin/users/").status_code == 404


def test_audit_log_lists_own_tenant_events_without_filters(world: World) -> None:
    page = login(world.a.owner).get("/audit/")
    assert b"project.created" in page.content and b"acme/acme-p1" in page.content
    assert b"globex" not in page.content


def test_member_cannot_open_audit_log(world: World) -> None:
    assert login(world.a.member).get("/audit/").status_code == 403


def test_owner_creates_project_and_sees_field_errors(world: World) -> None:
    client = login(world.a.owner)
    page = client.post("/t/acme/", {"project-name": "Not Valid!", "project-display_name": ""})
    assert page.status_code == 200
    assert b"lowercase letters" in page.content
    page = client.post("/t/acme/", {"project-name": "acme-p1"})
    assert b"already has a project" in page.content
    response = client.post("/t/acme/", {"project-name": "from-console"})
    assert response.status_code == 302
    assert Project.objects.filter(tenant=world.a.tenant, name="from-console").exists()


def test_project_admin_adds_and_changes_members(world: World) -> None:
    client = login(world.a.project_admin)
    # outsider belongs to no project of acme: the form warns first, then adds once confirmed
    warned = client.post("/t/acme/p/acme-p1/", {"member-username": "outsider",
                                                "member-role": "project_member"})
    assert warned.status_code == 200 and not Membership.objects.filter(user=world.outsider).exists()
    response = client.post("/t/acme/p/acme-p1/", {"member-username": "outsider",
                                                  "member-role": "project_member",
                                                  "member-outside_ok": "on"})
    assert response.status_code == 302
    membership = Membership.objects.get(user=world.outsider, project=world.a.project)
    client.post(f"/memberships/{membership.pk}/", {"role": "project_admin"})
    membership.refresh_from_db()
    assert membership.role == "project_admin"
    page = client.post("/t/acme/p/acme-p1/", {"member-username": "ghost", "member-role": "project_member",
                                              "member-outside_ok": "on"})
    assert b"No user who can be invited has this username." in page.content


def test_member_cannot_change_roles_from_console(world: World) -> None:
    membership = Membership.objects.get(user=world.a.member, project=world.a.project)
    response = login(world.a.member).post(f"/memberships/{membership.pk}/", {"role": "project_admin"})
    assert response.status_code == 403
    membership.refresh_from_db()
    assert membership.role == "project_member"


def test_owner_edits_project_quota_and_finds_it_in_audit_log(world: World) -> None:
    from decimal import Decimal

    from tenants import services

    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(8), "gpus_limit": Decimal(16)})
    client = login(world.a.owner)
    form = {"gpus_guaranteed": "12", "gpu_memory_mib_guaranteed": "0", "cpu_cores_guaranteed": "0",
            "ram_mib_guaranteed": "0"}
    page = client.post("/t/acme/p/acme-p1/quota/", form)
    assert page.status_code == 200 and b"guarantees 8" in page.content  # field error, nothing saved
    assert not Quota.objects.filter(project=world.a.project).exists()
    response = client.post("/t/acme/p/acme-p1/quota/", {**form, "gpus_guaranteed": "3"})
    assert response.status_code == 302
    assert Quota.objects.get(project=world.a.project).gpus_guaranteed == 3
    audit = client.get("/audit/", {"action": "quota."})
    assert b"quota.created" in audit.content
    csv = client.get("/audit/", {"action": "quota.", "format": "csv"})
    assert b"quota.created" in b"".join(csv.streaming_content)


def test_quota_table_reads_memory_in_gib(world: World) -> None:
    """Issue 32, finding 10: the console's quota table shows memory as people read it
    ("1,920 GiB"), never the raw MiB the form takes ("1966080")."""
    from decimal import Decimal

    from tenants import services

    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(8), "gpu_memory_mib_guaranteed": 1966080,
                               "ram_mib_limit": 2554})
    page = login(world.a.owner).get("/t/acme/").content.decode()
    assert "1,920 GiB" in page and "2.5 GiB" in page
    assert "1966080" not in page and "GPU memory (MiB)" not in page


def test_tokens_page_shows_secret_once_and_revokes(world: World) -> None:
    client = login(world.a.member)
    page = client.post("/tokens/", {"name": "ci", "expires_in_days": "30"})
    token = ApiToken.objects.get(user=world.a.member, name="ci")
    assert b"camp_" in page.content and page["Cache-Control"] == "no-store"
    again = client.get("/tokens/")
    assert token.prefix.encode() in again.content
    assert b'id="new-token"' not in again.content
    client.post(f"/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_platform_admin_pages(world: World) -> None:
    client = login(world.admin)
    assert client.get("/admin/tenants/").status_code == 200
    response = client.post("/admin/tenants/", {"name": "initech", "display_name": "Initech"})
    assert response.status_code == 302
    page = client.post("/admin/users/", {"username": "newbie", "password": "short"})
    assert b"too short" in page.content
    response = client.post("/admin/users/", {"username": "newbie", "password": "a-long-passphrase-42"})
    assert response.status_code == 302
    assert AuditEvent.objects.filter(action="user.created", target_repr="newbie").exists()


def test_csrf_is_enforced_on_console_forms(world: World) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(world.a.owner)
    response = client.post("/t/acme/", {"project-name": "no-csrf"})
    assert response.status_code == 403
    assert not Project.objects.filter(name="no-csrf").exists()


def test_login_is_throttled_per_account(world: World) -> None:
    client = Client()
    for _ in range(5):
        client.post("/login/", {"username": "acme-member", "password": "wrong"})
    locked = client.post("/login/", {"username": "acme-member", "password": PASSWORD})
    assert locked.status_code == 429
    assert b"Too many failed logins" in locked.content


def test_console_sets_a_project_gpu_limit_across_all_clusters(world: World) -> None:
    client = login(world.a.owner)
    form = {"gpus_guaranteed": "0", "gpu_memory_mib_guaranteed": "0", "cpu_cores_guaranteed": "0",
            "ram_mib_guaranteed": "0", "gpus_limit_all_clusters": "-3"}
    page = client.get("/t/acme/p/acme-p1/quota/")
    assert b"GPU limit across all clusters" in page.content
    bad = client.post("/t/acme/p/acme-p1/quota/", form)
    assert bad.status_code == 200 and not Quota.objects.filter(project=world.a.project).exists()
    assert "gpus_limit_all_clusters" in bad.context["form"].errors
    ok = client.post("/t/acme/p/acme-p1/quota/", {**form, "gpus_limit_all_clusters": "6"})
    assert ok.status_code == 302
    assert Quota.objects.get(project=world.a.project).gpus_limit_all_clusters == 6
    member = login(world.a.member)
    assert member.post("/t/acme/p/acme-p1/quota/", {**form, "gpus_limit_all_clusters": "60"}).status_code in (
        403, 404)
    assert Quota.objects.get(project=world.a.project).gpus_limit_all_clusters == 6
