"""The console in a real browser: log in, change a quota, find it in the audit log;
an outsider cannot open another tenant's pages."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from tenants import services
from tests.conftest import World
from tests.e2e.conftest import login, shot

pytestmark = pytest.mark.django_db(transaction=True)


def test_owner_changes_quota_and_finds_it_in_audit_log(world: World, live_server: Any, page: Any) -> None:
    services.quota_set(actor=world.admin, scope="tenant", tenant=world.a.tenant,
                       values={"gpus_guaranteed": Decimal(8), "gpus_limit": Decimal(16)})
    base = live_server.url
    login(page, base, "acme-owner")
    assert page.locator("h2", has_text="acme").count() == 1
    shot(page, "home")
    page.goto(f"{base}/t/acme/p/acme-p1/")
    page.click("text=Edit project quota")
    page.fill("#id_gpus_guaranteed", "20")
    page.click("form.quota button")
    # refused with the reason next to the field, nothing saved
    assert page.locator(".field.invalid .error").first.inner_text().startswith("The tenant guarantees 8")
    shot(page, "quota-error")
    page.fill("#id_gpus_guaranteed", "3")
    page.click("form.quota button")
    page.wait_for_url(f"{base}/t/acme/p/acme-p1/")
    assert "Quota saved." in page.inner_text(".messages")
    shot(page, "project")
    admin = page.locator("nav.links details.menu", has_text="Admin")  # the nav's Admin menu
    admin.locator("summary").click()
    admin.locator("a", has_text="Audit log").click()
    page.select_option("select[name=action]", "quota.created")
    page.click("text=Filter")
    row = page.locator("table.audit tbody tr").first
    assert "quota.created" in row.inner_text() and "acme-owner" in row.inner_text()
    shot(page, "audit-log")


def test_outsider_cannot_open_foreign_tenant(world: World, live_server: Any, page: Any) -> None:
    base = live_server.url
    login(page, base, "globex-member")
    response = page.goto(f"{base}/t/acme/")
    assert response.status == 404
    response = page.goto(f"{base}/t/acme/p/acme-p1/")
    assert response.status == 404
    page.goto(f"{base}/")
    assert "acme" not in page.inner_text("main")


def test_failed_login_shows_error_and_logout_ends_session(world: World, live_server: Any, page: Any) -> None:
    base = live_server.url
    page.goto(f"{base}/login/")
    page.fill("#id_username", "acme-member")
    page.fill("#id_password", "wrong")
    page.click("button[type=submit]")
    assert "correct username and password" in page.inner_text("main")
    shot(page, "login-error")
    login(page, base, "acme-member")
    page.click("text=Log out")
    page.wait_for_url(f"{base}/login/")
    page.goto(f"{base}/")
    assert page.url.startswith(f"{base}/login/")
