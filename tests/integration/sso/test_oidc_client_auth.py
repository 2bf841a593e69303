"""OIDC client authentication and kid-less key rotation (issue 31, items 3 and 4).

The provider is tests/integration/sso/oidc_provider.py, a real process; Camp knows only
its issuer URL. The browser's part of the code flow (follow the redirect to the provider,
come back with the code) is done with the test client and ``requests``: what is tested is
Camp's back-channel to the provider.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.core.cache import cache
from django.test import Client

from tenants.models import AuditEvent, User
from tenants.sso.config import AuthConfigError, oidc_settings
from tenants.sso.discovery import _key

from .conftest import configure, make_acme
from .servers import EdgeProvider

pytestmark = pytest.mark.django_db


def sign_in(client: Client) -> Any:
    """Camp → provider (which signs the user in at once) → Camp's callback; Camp's answer."""
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start.content[:500]
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302, at_provider.text[:500]
    back = urlsplit(at_provider.headers["Location"])
    return client.get(f"{back.path}?{back.query}", follow=True)


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


@pytest.fixture
def edge(settings: Any, edge_provider: EdgeProvider) -> EdgeProvider:
    make_acme()
    edge_provider.reset()
    cache.delete(_key("discovery", edge_provider.issuer))
    cache.delete(_key("jwks", f"{edge_provider.issuer}/jwks"))
    return edge_provider


@pytest.mark.parametrize("methods", [["client_secret_basic"], ["client_secret_post"]])
def test_client_authentication_follows_discovery(
        settings: Any, edge: EdgeProvider, methods: list[str]) -> None:
    edge.reset(token_auth_methods=methods)
    configure(settings, oidc=edge.camp_settings())
    before = edge.hits(f"token:{methods[0]}")
    client = Client()
    sign_in(client)
    assert signed_in(client), AuditEvent.objects.filter(action="auth.login_refused").values_list(
        "after", flat=True)
    assert edge.hits(f"token:{methods[0]}") == before + 1
    assert User.objects.filter(auth_source="oidc").count() == 1


def test_the_setting_wins_and_a_refused_client_is_named(settings: Any, edge: EdgeProvider) -> None:
    edge.reset(token_auth_methods=["client_secret_basic"])
    configure(settings, oidc=edge.camp_settings(token_auth_method="client_secret_post"))
    client = Client()
    page = sign_in(client)
    assert not signed_in(client)
    reason = AuditEvent.objects.get(action="auth.login_refused").after["reason"]
    assert "client authentication" in reason and "OIDC_TOKEN_AUTH_METHOD" in reason
    assert edge.camp_settings()["OIDC_TOKEN_AUTH_METHOD"] == ""
    assert page.status_code == 200
    with pytest.raises(AuthConfigError, match="OIDC_TOKEN_AUTH_METHOD"):
        oidc_settings(enabled=True, issuer=edge.issuer, client_id="c", client_secret="s",
                      token_auth_method="private_key_jwt")


def test_a_kidless_key_rotation_refetches_the_cached_jwks_once(
        settings: Any, edge: EdgeProvider) -> None:
    configure(settings, oidc=edge.camp_settings())
    edge.reset(keys=[{"kid": None, "pem": edge.key_a}])
    client = Client()
    sign_in(client)
    assert signed_in(client)
    jwks_hits = edge.hits("/jwks")

    # The provider replaces its only key; its tokens still carry no kid. The JWKS
    # Camp cached has the old key only.
    edge.reset(keys=[{"kid": None, "pem": edge.key_b}])
    client = Client()
    sign_in(client)
    assert signed_in(client), AuditEvent.objects.filter(action="auth.login_refused").values_list(
        "after", flat=True)
    assert edge.hits("/jwks") == jwks_hits + 1  # one refetch

    # A token signed by a key the provider does not publish is still refused, after at most
    # one refetch.
    from .servers import rsa_pem

    edge.reset(keys=[{"kid": None, "pem": edge.key_b}], tamper={"rogue_pem": rsa_pem()})
    client = Client()
    sign_in(client)
    assert not signed_in(client)
    assert edge.hits("/jwks") == jwks_hits + 2
    reasons = [e.after["reason"] for e in AuditEvent.objects.filter(action="auth.login_refused")]
    assert reasons == ["ID token signature does not verify"]
