"""OIDC edges through real Chromium: discovery only, kid-less tokens, key rotation, and every
callback failure ending on the login page with a message and an audit event (never a 500).

The provider is tests/integration/sso/oidc_provider.py, a real process steered by a control
file; Camp knows only its issuer URL (discovery).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client

from tenants.models import AuditEvent, Membership, User
from tenants.sso.discovery import _key, discovery_url
from tenants.sso.oidc import EXPIRED_MESSAGE, STATE_MESSAGE, UNREACHABLE_MESSAGE, UNVERIFIED_MESSAGE

from .conftest import BrowserThread, configure, make_acme
from .servers import EdgeProvider, IdentityProvider, free_port, rsa_pem

pytestmark = pytest.mark.django_db(transaction=True)


def browse_login(page: Any, base: str) -> tuple[str, str, list[int]]:
    """Click the SSO button; return where the browser ends, the page, and Camp's 5xx statuses."""
    errors: list[int] = []
    page.on("response", lambda r: errors.append(r.status) if (
        r.url.startswith(base) and r.status >= 500) else None)
    page.goto(f"{base}/login/")
    page.click("#oidc-login")
    page.wait_for_url(lambda url: url.startswith(base) and "/oidc/" not in url, timeout=20000)
    page.wait_for_load_state()
    return page.url, page.content(), errors


def refused_reasons() -> list[str]:
    return [str(e.after["reason"]) for e in AuditEvent.objects.filter(
        action="auth.login_refused").order_by("id")]


def forget_caches(provider: EdgeProvider) -> None:
    # Only this provider's keys: clearing the whole cache would flush a shared Redis db.
    cache.delete(_key("discovery", provider.issuer))
    cache.delete(_key("jwks", f"{provider.issuer}/jwks"))


@pytest.fixture
def edge(settings: Any, edge_provider: EdgeProvider, live_server: Any) -> str:
    configure(settings, oidc=edge_provider.camp_settings())
    make_acme()
    edge_provider.reset()
    forget_caches(edge_provider)
    return str(live_server.url).replace("localhost", "127.0.0.1")


def test_a_kidless_token_is_verified_against_the_single_key(
        edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    edge_provider.reset(keys=[{"kid": None, "pem": edge_provider.key_a}])
    url, html, errors = browser.run(browse_login, browser.new_page(), edge)
    assert "/login/" not in url and "Log out" in html, html[:1500]
    edna = User.objects.get(auth_source="oidc")
    assert (edna.username, edna.sso_issuer, edna.sso_subject) == (
        "edna", edge_provider.issuer, "edge-0001")
    assert {m.role for m in Membership.objects.filter(user=edna)} == {"project_member"}
    assert errors == []


def test_a_kidless_token_with_several_keys_is_refused_clearly(
        edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    edge_provider.reset(keys=[{"kid": None, "pem": edge_provider.key_a},
                              {"kid": None, "pem": edge_provider.key_b}])
    url, html, errors = browser.run(browse_login, browser.new_page(), edge)
    assert url.startswith(f"{edge}/login/") and UNVERIFIED_MESSAGE in html.replace("&#x27;", "'")
    assert not User.objects.filter(auth_source="oidc").exists()
    assert "has no kid" in refused_reasons()[-1] and "2 RS256 keys" in refused_reasons()[-1]
    assert errors == []


def test_keys_rotate_mid_run_the_jwks_is_cached_and_refreshed_once(
        edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    page = browser.new_page()
    before_jwks, before_disco = edge_provider.hits("/jwks"), edge_provider.hits(
        "/.well-known/openid-configuration")
    url, html, _ = browser.run(browse_login, page, edge)
    assert "Log out" in html
    assert edge_provider.hits("/jwks") == before_jwks + 1

    # Same key again: served from the cache.
    browser.run(lambda: page.context.clear_cookies())
    url, html, _ = browser.run(browse_login, page, edge)
    assert "Log out" in html
    assert edge_provider.hits("/jwks") == before_jwks + 1

    # The provider rotates to key "b" and stops publishing "a": one refresh, then success.
    edge_provider.reset(keys=[{"kid": "b", "pem": edge_provider.key_b}])
    browser.run(lambda: page.context.clear_cookies())
    url, html, errors = browser.run(browse_login, page, edge)
    assert "Log out" in html, html[:1500]
    assert edge_provider.hits("/jwks") == before_jwks + 2
    assert edge_provider.hits("/.well-known/openid-configuration") == before_disco + 1
    assert User.objects.filter(auth_source="oidc").count() == 1
    assert errors == []


CALLBACK_FAILURES = {
    # id: (control for the provider, message shown, audited reason contains)
    "provider-down": ({"token_status": 503}, UNREACHABLE_MESSAGE, "provider unreachable"),
    "bad-signature": ({"tamper": {"rogue_pem": rsa_pem()}}, UNVERIFIED_MESSAGE,
                      "signature does not verify"),
    "wrong-audience": ({"tamper": {"claims": {"aud": "another-client"}}}, UNVERIFIED_MESSAGE,
                       "audience"),
    "wrong-issuer": ({"tamper": {"claims": {"iss": "https://evil.example.test"}}},
                     UNVERIFIED_MESSAGE, "issuer"),
    "expired": ({"tamper": {"offsets": {"iat": -900, "exp": -600}}}, EXPIRED_MESSAGE, "expired"),
    "clock-skew": ({"tamper": {"offsets": {"iat": 600, "exp": 900}}}, EXPIRED_MESSAGE,
                   "in the future"),
}


@pytest.mark.parametrize("case", list(CALLBACK_FAILURES), ids=list(CALLBACK_FAILURES))
def test_each_callback_failure_ends_on_the_login_page_with_a_message(
        case: str, edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    control, message, reason = CALLBACK_FAILURES[case]
    edge_provider.reset(**control)
    url, html, errors = browser.run(browse_login, browser.new_page(), edge)
    assert url.startswith(f"{edge}/login/"), url
    assert message in html.replace("&#x27;", "'"), html[:2000]
    assert errors == []
    assert not User.objects.filter(auth_source="oidc").exists()
    assert reason in refused_reasons()[-1]
    # One refusal per attempt, and no secret in it.
    assert len(refused_reasons()) == 1 and edge_provider.client_secret not in refused_reasons()[0]


def test_a_small_clock_skew_is_tolerated(
        edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    edge_provider.reset(tamper={"offsets": {"iat": 20}})  # within OIDC_CLOCK_SKEW_SECONDS=60
    url, html, _ = browser.run(browse_login, browser.new_page(), edge)
    assert "Log out" in html and User.objects.filter(auth_source="oidc").exists()


def test_a_forged_or_replayed_callback_shows_the_login_page(
        edge: str, browser: BrowserThread) -> None:
    def forged(page: Any) -> tuple[str, str]:
        response = page.goto(f"{edge}/oidc/callback/?code=stolen&state=not-ours")
        assert response.status == 200  # after the redirect to the login page
        return page.url, page.content()

    url, html = browser.run(forged, browser.new_page())
    assert url.startswith(f"{edge}/login/") and STATE_MESSAGE in html
    assert refused_reasons() == ["callback state unknown to this session"]


def test_an_unreachable_provider_at_discovery_shows_the_login_page(
        settings: Any, edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    configure(settings, oidc=edge_provider.camp_settings() | {
        "OIDC_ISSUER": f"http://127.0.0.1:{free_port()}"})
    url, html, errors = browser.run(browse_login, browser.new_page(), edge)
    assert url.startswith(f"{edge}/login/") and UNREACHABLE_MESSAGE in html
    assert errors == []
    assert refused_reasons()[-1].startswith("provider unreachable: the provider's discovery")


def test_logout_ends_the_provider_session_too(
        edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    page = browser.new_page()
    _, html, _ = browser.run(browse_login, page, edge)
    assert "Log out" in html
    valid_hints = edge_provider.hits("logout:valid_id_token_hint")

    def logout() -> str:
        page.click("form.logout button")
        page.wait_for_url(f"{edge}/login/**")
        page.goto(f"{edge}/")
        return str(page.url)

    assert "/login/" in browser.run(logout)  # the Camp session is gone
    assert edge_provider.hits("logout:valid_id_token_hint") == valid_hints + 1
    edna = User.objects.get(auth_source="oidc")
    assert AuditEvent.objects.filter(action="auth.logout", actor=edna).exists()


def test_explicit_endpoints_override_discovery(
        settings: Any, idp: IdentityProvider, db: Any) -> None:
    configure(settings, oidc=idp.camp_settings(
        authorization_endpoint="https://login.elsewhere.example.test/authorize"))
    cache.delete(_key("discovery", idp.issuer))
    redirect = Client().get("/oidc/authenticate/")
    assert redirect["Location"].startswith("https://login.elsewhere.example.test/authorize?")
    assert discovery_url(idp.issuer) == f"{idp.issuer}/.well-known/openid-configuration"


def test_discovery_is_cached_and_fetched_again_after_a_provider_failure(
        edge: str, edge_provider: EdgeProvider, browser: BrowserThread) -> None:
    page = browser.new_page()
    disco = edge_provider.hits("/.well-known/openid-configuration")
    assert "Log out" in browser.run(browse_login, page, edge)[1]
    assert edge_provider.hits("/.well-known/openid-configuration") == disco + 1

    edge_provider.reset(token_status=500)
    browser.run(lambda: page.context.clear_cookies())
    url, html, _ = browser.run(browse_login, page, edge)
    assert url.startswith(f"{edge}/login/") and UNREACHABLE_MESSAGE in html
    assert edge_provider.hits("/.well-known/openid-configuration") == disco + 1  # still cached

    edge_provider.reset()
    browser.run(lambda: page.context.clear_cookies())
    assert "Log out" in browser.run(browse_login, page, edge)[1]
    assert edge_provider.hits("/.well-known/openid-configuration") == disco + 2  # rediscovered


def _http_login(client: Client) -> Any:
    """The code flow over plain HTTP: Camp → provider (auto sign-in) → Camp's callback."""
    import requests as http

    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start
    back = http.get(start["Location"], allow_redirects=False, timeout=10)
    callback = back.headers["Location"]
    return client.get(callback[callback.index("/oidc/callback/"):])


def test_refused_sso_logins_from_many_addresses_do_not_lock_out_everyone(
        settings: Any, edge: str, edge_provider: EdgeProvider) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 3
    settings.OIDC_CREATE_USER = False  # every callback below is refused by the backend
    for n in range(4):
        response = _http_login(Client(REMOTE_ADDR=f"10.1.0.{n + 1}"))
        assert response.status_code == 302 and response["Location"] == "/login/"
    # One address that keeps failing is still locked out (per address).
    for _ in range(3):
        _http_login(Client(REMOTE_ADDR="10.2.0.1"))
    settings.OIDC_CREATE_USER = True
    assert _http_login(Client(REMOTE_ADDR="10.2.0.1")).status_code == 429
    assert not User.objects.filter(auth_source="oidc").exists()
    # A password guesser locking a name and its own address locks no one's SSO elsewhere.
    for _ in range(4):
        Client(REMOTE_ADDR="10.3.0.1").post("/login/", {"username": "alice", "password": "guess"})
    # Everyone else signs in.
    response = _http_login(Client(REMOTE_ADDR="10.1.0.99"))
    assert response.status_code == 302 and response["Location"] != "/login/", response
    assert User.objects.filter(auth_source="oidc").exists()
