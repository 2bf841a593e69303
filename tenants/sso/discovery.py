"""The OpenID provider's metadata and signing keys, fetched and cached.

mozilla-django-oidc reads fixed endpoint URLs from settings and fetches the JWKS
at every login without caching, and it has no discovery. This module adds the two
things it lacks, kept small: OpenID Connect Discovery 1.0 (``OIDC_ISSUER`` alone is
enough; explicit endpoint settings still win) and a JWKS cache that refreshes once
when a token names an unknown key (key rotation). Both live in Django's cache
(Redis in production), so every worker process shares them.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import requests
from django.conf import settings
from django.core.cache import cache

from .config import TOKEN_AUTH_METHODS

logger = logging.getLogger(__name__)

_ENDPOINTS = {
    # discovery field → Camp setting that overrides it
    "authorization_endpoint": "OIDC_OP_AUTHORIZATION_ENDPOINT",
    "token_endpoint": "OIDC_OP_TOKEN_ENDPOINT",
    "userinfo_endpoint": "OIDC_OP_USER_ENDPOINT",
    "jwks_uri": "OIDC_OP_JWKS_ENDPOINT",
    "end_session_endpoint": "OIDC_OP_LOGOUT_ENDPOINT",
}
_REQUIRED = ("authorization_endpoint", "token_endpoint", "jwks_uri")


class ProviderError(Exception):
    """The provider could not be reached or answered something unusable.

    ``reason`` goes to the audit log and the server log: it never quotes a token.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ProviderEndpoints:
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    end_session_endpoint: str


def _key(kind: str, url: str) -> str:
    return f"camp:oidc:{kind}:{hashlib.sha256(url.encode()).hexdigest()[:32]}"


def _get_json(url: str, what: str) -> dict[str, Any]:
    try:
        response = requests.get(url, timeout=getattr(settings, "OIDC_TIMEOUT", 10),
                                verify=getattr(settings, "OIDC_VERIFY_SSL", True))
        response.raise_for_status()
        data = response.json()
    except requests.RequestException as exc:
        # The exception text may quote the answer; its type is enough to diagnose.
        raise ProviderError(f"{what} unreachable ({type(exc).__name__})") from exc
    except ValueError as exc:
        raise ProviderError(f"{what} is not JSON") from exc
    if not isinstance(data, dict):
        raise ProviderError(f"{what} is not a JSON object")
    return data


def discovery_url(issuer: str) -> str:
    # OpenID Connect Discovery 1.0 §4: issuer without its trailing slash + the well-known path.
    return issuer.rstrip("/") + "/.well-known/openid-configuration"


def provider_metadata(*, refresh: bool = False) -> dict[str, Any]:
    """The provider's discovery document, from the cache unless ``refresh``."""
    issuer = str(getattr(settings, "OIDC_ISSUER", ""))
    key = _key("discovery", issuer)
    if not refresh:
        cached = cache.get(key)
        if isinstance(cached, dict):
            return cached
    data = _get_json(discovery_url(issuer), "the provider's discovery document")
    # Discovery §4.3: the issuer in the document must be exactly the one configured.
    if data.get("issuer") != issuer:
        raise ProviderError("the discovery document names another issuer than OIDC_ISSUER")
    cache.set(key, data, getattr(settings, "OIDC_DISCOVERY_CACHE_SECONDS", 3600))
    return data


def forget_provider_metadata() -> None:
    """Drop the cached discovery document (after a failure that may come from staleness)."""
    issuer = str(getattr(settings, "OIDC_ISSUER", ""))
    cache.delete(_key("discovery", issuer))


def endpoints(*, refresh: bool = False) -> ProviderEndpoints:
    """Each endpoint from its setting if set, else from discovery (fetched only if needed)."""
    values = {field: str(getattr(settings, name, "") or "") for field, name in _ENDPOINTS.items()}
    # Discovery only when a required endpoint is not set by hand; then the optional ones
    # (userinfo, end_session) come from it too, else only from their own settings.
    # HS256 tokens are checked with the client secret: no JWKS needed.
    required = _REQUIRED if not str(getattr(settings, "OIDC_RP_SIGN_ALGO", "")).startswith(
        "HS") else _REQUIRED[:2]
    if any(not values[f] for f in required):
        metadata = provider_metadata(refresh=refresh)
        for field in values:
            if not values[field]:
                value = metadata.get(field)
                values[field] = value if isinstance(value, str) else ""
    missing = [f for f in required if not values[f]]
    if missing:
        raise ProviderError(f"the provider publishes no {', '.join(missing)}")
    return ProviderEndpoints(**values)


def jwks(jwks_uri: str, *, refresh: bool = False) -> dict[str, Any]:
    """The provider's JSON Web Key Set, from the cache unless ``refresh``."""
    key = _key("jwks", jwks_uri)
    if not refresh:
        cached = cache.get(key)
        if isinstance(cached, dict):
            return cached
    data = _get_json(jwks_uri, "the provider's JWKS")
    if not isinstance(data.get("keys"), list):
        raise ProviderError("the provider's JWKS has no keys list")
    cache.set(key, data, getattr(settings, "OIDC_JWKS_CACHE_SECONDS", 3600))
    return data


_KTY_FOR_ALG = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}


class KeyChoiceError(Exception):
    """No key, or no single key, of the JWKS can verify the token."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def choose_key(keys: list[dict[str, Any]], *, kid: str | None, alg: str) -> dict[str, Any]:
    """The JWK that verifies a token signed with ``alg`` and key id ``kid``.

    RFC 7517 §4.5: ``kid`` selects the key. A token without ``kid`` is acceptable only
    when exactly one signing key of the right type is published (single-key providers
    omit it); with several, guessing would mean trying keys until one fits.
    """
    kty = _KTY_FOR_ALG.get(alg[:2])
    usable = [
        k for k in keys
        if isinstance(k, dict) and k.get("use", "sig") == "sig" and k.get("kty") == kty
        and k.get("alg", alg) == alg
    ]
    if kid is not None:
        match = [k for k in usable if k.get("kid") == kid]
        if len(match) != 1:
            raise KeyChoiceError(f"no signing key with kid {kid[:64]!r} in the provider's JWKS")
        return match[0]
    if len(usable) == 1:
        return usable[0]
    if not usable:
        raise KeyChoiceError(f"the provider's JWKS has no {alg} signing key")
    raise KeyChoiceError(
        f"the ID token has no kid and the provider's JWKS has {len(usable)} {alg} keys; "
        "Camp cannot tell which one signed it")


def token_auth_method() -> str:
    """OIDC_TOKEN_AUTH_METHOD if set; else the provider's choice from discovery.

    Discovery's ``token_endpoint_auth_methods_supported`` decides (basic first, the
    RFC 6749 default every server must support); without discovery, or when the document
    omits the list (Discovery 1.0 §3: the default is then ``client_secret_basic``), basic.
    """
    configured = str(getattr(settings, "OIDC_TOKEN_AUTH_METHOD", "") or "")
    if configured:
        return configured
    values = {field: str(getattr(settings, name, "") or "") for field, name in _ENDPOINTS.items()}
    if all(values[f] for f in _REQUIRED):
        return TOKEN_AUTH_METHODS[0]  # discovery is not used at all
    supported = provider_metadata().get("token_endpoint_auth_methods_supported")
    if not isinstance(supported, list):
        return TOKEN_AUTH_METHODS[0]
    for method in TOKEN_AUTH_METHODS:
        if method in supported:
            return method
    raise ProviderError("the provider supports neither client_secret_basic nor "
                        "client_secret_post at its token endpoint")
