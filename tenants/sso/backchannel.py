"""OpenID Connect Back-Channel Logout 1.0: the provider ends Camp sessions directly.

At each OIDC sign-in Camp records the session's ``sid`` and ``sub`` (``OidcSession``). The
provider POSTs a ``logout_token`` to ``/oidc/backchannel-logout/``; Camp verifies it (§2.6:
signature with the provider's JWKS, iss, aud, iat, exp if present, the back-channel logout
event, ``sid`` or ``sub``, no ``nonce``, ``jti`` never seen before) and ends the matching
sessions: with ``sid``, that session; with ``sub`` alone, every session of that subject. Open
live pages of those sessions close at once. Audited as ``auth.backchannel_logout`` by
``sso:oidc``.
"""

from __future__ import annotations

import hashlib
import logging
from importlib import import_module
from typing import Any

import jwt
from django.conf import settings
from django.contrib.auth.signals import user_logged_out
from django.core.cache import cache
from django.dispatch import receiver
from django.http import HttpRequest

from tenants.audit import audit_record
from tenants.models import OidcSession, User

from .discovery import KeyChoiceError, ProviderError, choose_key, endpoints, jwks
from .oidc import _setting

logger = logging.getLogger(__name__)

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
MAX_AGE_SECONDS = 600  # a logout token older than this is refused (iat); jti kept as long


class LogoutTokenRefused(Exception):
    """The logout token is not one Camp accepts; ``reason`` names why (audited, answered)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def record_login(request: HttpRequest, user: User, claims: dict[str, Any]) -> None:
    """Remember which provider session this Camp session belongs to (after ``login()``)."""
    key = request.session.session_key
    if not key:
        request.session.save()
        key = request.session.session_key
    OidcSession.objects.update_or_create(
        session_key=key,
        defaults={"user": user, "issuer": str(_setting("OIDC_ISSUER"))[:255],
                  "subject": str(claims.get("sub", ""))[:255],
                  "sid": str(claims.get("sid", "") or "")[:255]})


@receiver(user_logged_out)
def _forget_on_logout(sender: Any, request: HttpRequest | None, **kwargs: Any) -> None:
    key = getattr(getattr(request, "session", None), "session_key", None)
    if key:
        OidcSession.objects.filter(session_key=key).delete()


def _key_for(token: str, alg: str) -> Any:
    header = jwt.get_unverified_header(token)
    if header.get("alg") != alg:
        raise LogoutTokenRefused(f"algorithm {str(header.get('alg'))[:16]!r} is not OIDC_SIGN_ALGO")
    if alg.startswith("HS"):
        return str(_setting("OIDC_RP_CLIENT_SECRET"))
    kid = header.get("kid")
    kid = None if kid is None else str(kid)
    uri = endpoints().jwks_uri
    try:
        jwk = choose_key(jwks(uri)["keys"], kid=kid, alg=alg)
    except KeyChoiceError:
        try:  # the provider may have rotated its key since the JWKS was cached
            jwk = choose_key(jwks(uri, refresh=True)["keys"], kid=kid, alg=alg)
        except KeyChoiceError as exc:
            raise LogoutTokenRefused(exc.reason) from exc
    return jwt.PyJWK(jwk, algorithm=alg).key


def verify_logout_token(token: str) -> dict[str, Any]:
    """The claims of a valid logout token (Back-Channel Logout 1.0 §2.6), or LogoutTokenRefused."""
    alg = str(_setting("OIDC_RP_SIGN_ALGO"))
    try:
        key = _key_for(token, alg)
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=[alg], audience=str(_setting("OIDC_RP_CLIENT_ID")),
            issuer=str(_setting("OIDC_ISSUER")), leeway=int(_setting("OIDC_CLOCK_SKEW_SECONDS")),
            options={"require": ["iss", "aud", "iat", "jti"]})
    except ProviderError as exc:
        raise LogoutTokenRefused(f"provider keys unavailable: {exc.reason}") from exc
    except jwt.InvalidAudienceError as exc:
        raise LogoutTokenRefused("audience does not include this client") from exc
    except jwt.InvalidIssuerError as exc:
        raise LogoutTokenRefused("issuer does not match OIDC_ISSUER") from exc
    except jwt.InvalidSignatureError as exc:
        raise LogoutTokenRefused("signature does not verify") from exc
    except jwt.MissingRequiredClaimError as exc:
        raise LogoutTokenRefused(f"no {exc.claim} claim") from exc
    except jwt.PyJWTError as exc:
        raise LogoutTokenRefused(f"not a valid JWT ({type(exc).__name__})") from exc
    events = claims.get("events")
    if not isinstance(events, dict) or not isinstance(events.get(LOGOUT_EVENT), dict):
        raise LogoutTokenRefused("no back-channel logout event in the events claim")
    if "nonce" in claims:
        raise LogoutTokenRefused("a logout token must not carry a nonce")
    if not (claims.get("sid") or claims.get("sub")):
        raise LogoutTokenRefused("neither sid nor sub")
    skew = int(_setting("OIDC_CLOCK_SKEW_SECONDS"))
    import time

    if not isinstance(claims["iat"], int | float) or claims["iat"] < time.time() - MAX_AGE_SECONDS - skew:
        raise LogoutTokenRefused("issued too long ago (iat)")
    jti = hashlib.sha256(f"{claims['iss']}\0{claims['jti']}".encode()).hexdigest()
    if not cache.add(f"oidc-bcl-jti:{jti}", 1, MAX_AGE_SECONDS + 2 * skew):
        raise LogoutTokenRefused("replayed (jti already used)")
    return claims


def end_sessions(claims: dict[str, Any]) -> tuple[list[OidcSession], int]:
    """End the Camp sessions the claims name; the records and how many sessions ended."""
    from tenants.sockets import close_session_sockets

    rows = OidcSession.objects.filter(issuer=str(_setting("OIDC_ISSUER"))).select_related("user")
    if claims.get("sid"):
        rows = rows.filter(sid=str(claims["sid"]))
        if claims.get("sub"):
            rows = rows.filter(subject=str(claims["sub"]))
    else:
        rows = rows.filter(subject=str(claims["sub"]))
    found = list(rows)
    store = import_module(settings.SESSION_ENGINE).SessionStore
    for row in found:
        store(session_key=row.session_key).delete()
        close_session_sockets(row.session_key)
    OidcSession.objects.filter(pk__in=[r.pk for r in found]).delete()
    return found, len(found)


def audit_logout(claims: dict[str, Any], ended: list[OidcSession]) -> None:
    user = ended[0].user if ended else None
    audit_record(actor=None, actor_username="sso:oidc", action="auth.backchannel_logout",
                 target=user, target_repr=None if user else f"sub {str(claims.get('sub', ''))[:200]}",
                 after={"sid": str(claims.get("sid", ""))[:255],
                        "sub": str(claims.get("sub", ""))[:255],
                        "sessions_ended": len(ended)})


def audit_refusal(reason: str) -> None:
    audit_record(actor=None, actor_username="sso:oidc", action="auth.backchannel_logout_refused",
                 target_repr="logout_token", after={"reason": reason})
    logger.warning("Refused a back-channel logout token: %s", reason)
