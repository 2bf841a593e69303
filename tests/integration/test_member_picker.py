"""Members are picked from the tenant's users, not only typed (issue 32, finding 10): the
project page lists the tenant's users who are not members yet (nobody of another tenant), and
a username that is none of the tenant's users asks for a confirmation first — the same words
whether such a user exists or not, so the page tells nothing about users outside the tenant."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from tenants.models import Membership, Role
from tests.conftest import make_user

pytestmark = pytest.mark.django_db


def _strip(html: str, name: str) -> str:
    """A page without its CSRF token and with the typed username replaced (to compare two)."""
    return re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", html.replace(name, "NAME"))


def _page(client: Client, url: str) -> str:
    r = client.get(url)
    assert r.status_code == 200
    return r.content.decode()


def test_picker_lists_the_tenants_users_not_yet_in_the_project(world: Any) -> None:
    url = f"/t/{world.a.tenant.name}/p/{world.a.project.name}/"
    c = Client()
    c.force_login(world.a.project_admin)
    page = _page(c, url)
    picker = re.search(r'<datalist id="tenant-users">(.*?)</datalist>', page, re.S)
    assert picker and 'list="tenant-users"' in page  # the username field offers the list
    listed = set(re.findall(r'<option value="([^"]+)"', picker.group(1)))
    assert listed == {world.a.owner.username}  # of acme, not in acme-p1 yet
    assert world.b.member.username not in page and world.outsider.username not in page
    # picking one adds them, with no confirmation
    r = c.post(url, {"member-username": world.a.owner.username, "member-role": Role.PROJECT_MEMBER})
    assert r.status_code == 302
    assert Membership.objects.filter(user=world.a.owner, project=world.a.project).exists()


def test_someone_outside_the_tenant_is_added_only_after_a_warning(world: Any) -> None:
    url = f"/t/{world.a.tenant.name}/p/{world.a.project.name}/"
    c = Client()
    c.force_login(world.a.owner)
    other = world.b.member  # a user of globex
    warned = c.post(url, {"member-username": other.username, "member-role": Role.PROJECT_MEMBER})
    assert warned.status_code == 200
    page = warned.content.decode()
    assert "is not one of the users of tenant acme" in page and 'name="member-outside_ok"' in page
    assert not Membership.objects.filter(user=other, project=world.a.project).exists()
    # the warning is word for word the same for a username nobody has: no existence oracle
    nobody = c.post(url, {"member-username": "no-such-user", "member-role": Role.PROJECT_MEMBER})
    assert _strip(nobody.content.decode(), "no-such-user") == _strip(page, other.username)
    # confirmed, the membership is made as before
    r = c.post(url, {"member-username": other.username, "member-role": Role.PROJECT_MEMBER,
                     "member-outside_ok": "1"})
    assert r.status_code == 302
    assert Membership.objects.filter(user=other, project=world.a.project).exists()


def test_inactive_users_are_not_offered(world: Any) -> None:
    gone = make_user("acme-gone", is_active=False)
    Membership.objects.create(user=gone, tenant=world.a.tenant, project=world.a.other_project,
                              role=Role.PROJECT_MEMBER)
    c = Client()
    c.force_login(world.a.owner)
    page = _page(c, f"/t/{world.a.tenant.name}/p/{world.a.project.name}/")
    assert "acme-gone" not in page
