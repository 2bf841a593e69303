"""OIDC sign-in through a real django-oauth-toolkit provider, in real Chromium.

Camp runs as pytest-django's live server; the provider runs as its own process and Camp
knows only its issuer URL (OpenID Connect Discovery).
"""

from __future__ import annotations

from typing import Any

import pytest

from tenants.models import AuditEvent, Membership, User

from .conftest import BrowserThread, configure, make_acme
from .servers import IdentityProvider

pytestmark = pytest.mark.django_db(transaction=True)


def sso_login(page: Any, base: str, username: str, password: str) -> tuple[str, str]:
    """Click the SSO button on Camp's login page; sign in at the IdP if it asks."""
    page.goto(f"{base}/login/")
    page.click("#oidc-login")
    page.wait_for_load_state()
    if "/accounts/login/" in page.url:
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("#idp-submit")
    try:
        page.wait_for_url(f"{base}/**", timeout=20000)
    except Exception as exc:
        raise AssertionError(f"never came back to Camp; at {page.url}:\n{page.content()[:2000]}") from exc
    page.wait_for_load_state()
    return page.url, page.content()


def logout(page: Any, base: str) -> str:
    page.click("form.logout button")
    page.wait_for_url(f"{base}/login/**")
    return page.url


def roles_of(user: User) -> set[str]:
    return {f"{m.role}:{m.project or m.tenant.name}" for m in Membership.objects.filter(user=user)}


@pytest.fixture
def oidc_on(settings: Any, idp: IdentityProvider, live_server: Any) -> str:
    configure(settings, oidc=idp.camp_settings())
    # Only the issuer is configured: every endpoint comes from DOT's discovery document.
    assert not (settings.OIDC_OP_AUTHORIZATION_ENDPOINT or settings.OIDC_OP_TOKEN_ENDPOINT
                or settings.OIDC_OP_JWKS_ENDPOINT or settings.OIDC_OP_USER_ENDPOINT)
    make_acme()
    # The provider accepts any port on the loopback IP (RFC 8252), not on "localhost".
    return str(live_server.url).replace("localhost", "127.0.0.1")


def test_browser_login_creates_the_account_maps_groups_and_resyncs(
        oidc_on: str, idp: IdentityProvider, browser: BrowserThread) -> None:
    base = oidc_on
    # A local account with the same e-mail exists: it must not be taken over.
    User.objects.create(username="erin-local", email="erin@example.test")
    idp.add_user("erin", "erin-idp-pw", email="erin@example.test", given_name="Erin",
                 family_name="Example", groups=["acme-owners", "acme-ml"])
    page = browser.new_page()

    url, html = browser.run(sso_login, page, base, "erin", "erin-idp-pw")
    assert url.rstrip("/") == base or "/login" not in url, html[:500]
    assert "erin" in html and "Log out" in html
    erin = User.objects.get(auth_source="oidc")
    assert (erin.username, erin.email, erin.first_name) == ("erin", "erin@example.test", "Erin")
    assert (erin.sso_issuer, erin.sso_subject) != ("", "")
    assert erin.sso_issuer == idp.issuer
    assert roles_of(erin) == {"tenant_owner:acme", "project_member:acme/ml"}
    assert User.objects.filter(email="erin@example.test").count() == 2
    assert AuditEvent.objects.filter(action="auth.login", actor=erin).exists()

    # The groups change at the provider; the next login re-syncs them.
    assert "/login/" in browser.run(logout, page, base)
    idp.set_claims("erin", email="erin@example.test", given_name="Erin",
                   groups=["acme-ml-leads", "camp-admins"])
    url, html = browser.run(sso_login, page, base, "erin", "erin-idp-pw")
    assert "Log out" in html
    erin.refresh_from_db()
    assert erin.is_platform_admin
    assert roles_of(erin) == {"project_admin:acme/ml"}
    removed = AuditEvent.objects.get(action="membership.deleted", actor_username="sso:oidc")
    assert removed.before["role"] == "tenant_owner"
    assert User.objects.filter(auth_source="oidc").count() == 1  # same (issuer, subject)


def test_username_clash_is_refused_with_a_message(
        oidc_on: str, idp: IdentityProvider, browser: BrowserThread) -> None:
    base = oidc_on
    User.objects.create(username="frank", email="frank@example.test", auth_source="ldap")
    idp.add_user("frank", "frank-idp-pw", email="frank@example.test", groups=["camp-admins"])
    page = browser.new_page()
    url, html = browser.run(sso_login, page, base, "frank", "frank-idp-pw")
    assert "/login/" in url
    assert "already taken by another Camp account" in html
    assert not User.objects.filter(auth_source="oidc").exists()
    assert not User.objects.get(username="frank").is_platform_admin
    refused = AuditEvent.objects.get(action="auth.login_refused")
    assert refused.after == {"source": "oidc", "reason": "username clash with an existing account"}
