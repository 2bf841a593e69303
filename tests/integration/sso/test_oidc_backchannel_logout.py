"""OpenID Connect Back-Channel Logout 1.0 (issue 31, item 5): the provider ends Camp sessions.

Sign-ins go through the real code flow against tests/integration/sso/oidc_provider.py (a
separate process serving discovery and its JWKS); logout tokens are signed with that
provider's key (or, for the attacks, with another one) and POSTed as a provider does: no
cookie, no CSRF token.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import jwt
import pytest
import requests
from django.test import Client

from tenants.models import AuditEvent, OidcSession, User
from tenants.sso.backchannel import LOGOUT_EVENT

from .conftest import configure, make_acme
from .servers import EdgeProvider, rsa_pem
from .test_oidc_edges import forget_caches

pytestmark = pytest.mark.django_db

ENDPOINT = "/oidc/backchannel-logout/"
EDNA = {"sub": "edge-0001", "preferred_username": "edna", "email": "edna@example.test",
        "groups": ["acme-ml"]}


@pytest.fixture
def provider(settings: Any, edge_provider: EdgeProvider) -> EdgeProvider:
    configure(settings, oidc=edge_provider.camp_settings())
    make_acme()
    edge_provider.reset()
    forget_caches(edge_provider)
    return edge_provider


def sign_in(provider: EdgeProvider, sid: str) -> Client:
    """The code flow with the test client as the browser; the provider's session is ``sid``."""
    provider.reset(user={**EDNA, "sid": sid})
    client = Client()
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302
    at_provider = requests.get(start["Location"], allow_redirects=False, timeout=10)
    back = urlsplit(at_provider.headers["Location"])
    done = client.get(f"{back.path}?{back.query}")
    assert done.status_code == 302 and "/login/" not in done["Location"], done["Location"]
    assert client.get("/").status_code == 200
    return client


def logout_token(provider: EdgeProvider, *, pem: str | None = None, kid: str | None = "a",
                 **claims: Any) -> str:
    body: dict[str, Any] = {"iss": provider.issuer, "aud": provider.client_id,
                            "iat": int(time.time()), "jti": str(uuid.uuid4()),
                            "events": {LOGOUT_EVENT: {}}, "sub": EDNA["sub"]}
    body.update(claims)
    body = {k: v for k, v in body.items() if v is not None}
    headers = {"kid": kid, "typ": "logout+jwt"} if kid else {"typ": "logout+jwt"}
    return jwt.encode(body, pem or provider.key_a, algorithm="RS256", headers=headers)


def post(token: str) -> Any:
    # As a provider sends it: a form POST, no session cookie, no CSRF token.
    return Client(enforce_csrf_checks=True).post(ENDPOINT, {"logout_token": token})


def signed_in(client: Client) -> bool:
    return client.get("/").status_code == 200


def test_a_logout_token_with_sid_ends_that_session_only(provider: EdgeProvider) -> None:
    laptop, phone = sign_in(provider, "sid-laptop"), sign_in(provider, "sid-phone")
    edna = User.objects.get(username="edna")
    assert set(OidcSession.objects.filter(user=edna).values_list("sid", flat=True)) == {
        "sid-laptop", "sid-phone"}
    response = post(logout_token(provider, sid="sid-laptop"))
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    assert not signed_in(laptop)
    assert signed_in(phone)
    event = AuditEvent.objects.get(action="auth.backchannel_logout")
    assert event.actor_username == "sso:oidc" and event.target_id == str(edna.pk)
    assert (event.after or {}).get("sessions_ended") == 1
    assert edna.is_active  # a logout, not a deactivation


def test_a_logout_token_with_sub_alone_ends_every_session_of_the_subject(
        provider: EdgeProvider) -> None:
    laptop, phone = sign_in(provider, "sid-1"), sign_in(provider, "sid-2")
    assert post(logout_token(provider)).status_code == 200
    assert not signed_in(laptop) and not signed_in(phone)
    assert not OidcSession.objects.exists()


@pytest.mark.parametrize(("change", "reason"), [
    ({"pem": "rogue"}, "signature does not verify"),
    ({"kid": "unknown"}, "no signing key with kid"),
    ({"aud": "another-client"}, "audience"),
    ({"iss": "https://evil.example"}, "issuer"),
    ({"events": None}, "no back-channel logout event"),
    ({"events": {"http://schemas.openid.net/event/other": {}}}, "no back-channel logout event"),
    ({"nonce": "n-0"}, "must not carry a nonce"),
    ({"jti": None}, "no jti claim"),
    ({"iat": None}, "no iat claim"),
    ({"iat": int(time.time()) - 3600}, "issued too long ago"),
    ({"sub": None}, "neither sid nor sub"),
])
def test_an_invalid_logout_token_ends_nothing(provider: EdgeProvider, change: dict[str, Any],
                                              reason: str) -> None:
    browser = sign_in(provider, "sid-x")
    if change.get("pem") == "rogue":
        change = {**change, "pem": rsa_pem()}
    response = post(logout_token(provider, sid=None, **change))
    assert response.status_code == 400, response.content
    assert reason in response.json()["error_description"]
    assert signed_in(browser)
    refused = AuditEvent.objects.get(action="auth.backchannel_logout_refused")
    assert reason in str((refused.after or {}).get("reason"))


def test_a_replayed_logout_token_is_refused(provider: EdgeProvider) -> None:
    token = logout_token(provider, sid="sid-r")
    assert post(token).status_code == 200
    browser = sign_in(provider, "sid-r")  # the same provider session signs in again
    response = post(token)
    assert response.status_code == 400 and "replayed" in response.json()["error_description"]
    assert signed_in(browser)


def test_an_unsigned_logout_token_is_refused(provider: EdgeProvider) -> None:
    browser = sign_in(provider, "sid-n")
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    unsigned = ".".join([part({"alg": "none", "typ": "logout+jwt"}),
                         part({"iss": provider.issuer, "aud": provider.client_id,
                               "iat": int(time.time()), "jti": "j", "sid": "sid-n",
                               "events": {LOGOUT_EVENT: {}}}), ""])
    response = post(unsigned)
    assert response.status_code == 400 and "algorithm" in response.json()["error_description"]
    assert signed_in(browser)
