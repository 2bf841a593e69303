"""403, 404 and 500 are Camp's own pages with the nav, for every role, never Django's bare or
debug pages (issue 32, finding 1); the API keeps its JSON errors."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.conftest import World

pytestmark = pytest.mark.django_db

ROLES = ("platform_admin", "owner", "project_admin", "member", "outsider")


def _client(user: Any) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


@pytest.mark.parametrize("role", ROLES)
def test_a_missing_page_is_camps_own_page_with_the_nav(world: World, role: str) -> None:
    response = _client(world.user(role)).get("/scheduling/jobs/987654/")
    assert response.status_code == 404
    page = response.content.decode()
    assert 'data-status="404"' in page and 'class="links"' in page  # Camp's layout, with the nav
    assert "Traceback" not in page and "Page not found at" not in page  # never Django's page


def test_a_page_the_role_may_not_open_is_a_styled_403(world: World) -> None:
    response = _client(world.a.member).get("/audit/")
    assert response.status_code == 403
    page = response.content.decode()
    assert 'data-status="403"' in page and 'class="links"' in page
    assert "Ask a project admin or the tenant owner" in page


def test_a_server_error_is_a_styled_500_with_a_reference(world: World,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import tenants.views

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom: the secret detail of the failure")

    monkeypatch.setattr(tenants.views, "AuditEventFilter", broken)  # the audit page breaks
    response = _client(world.a.owner).get("/audit/", HTTP_X_REQUEST_ID="req-abc123")
    assert response.status_code == 500
    page = response.content.decode()
    assert 'data-status="500"' in page and 'class="links"' in page  # with the nav
    assert "req-abc123" in page  # the reference the platform team finds in the log
    assert "boom" not in page and "Traceback" not in page


def test_when_the_page_itself_cannot_render_a_bare_500_still_answers(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    import tenants.views

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(tenants.views.permissions, "scope_of", broken)  # the nav needs it too
    response = _client(world.a.owner).get("/audit/")
    assert response.status_code == 500
    page = response.content.decode()
    assert "Something went wrong on our side" in page and "boom" not in page


def test_the_api_keeps_json_errors(world: World) -> None:
    client = _client(world.a.member)
    response = client.get("/api/v1/jobs/987654/")
    assert response.status_code == 404 and response.json() == {"detail": "Not found."}
