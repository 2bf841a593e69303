"""OpenID Connect sign-in (mozilla-django-oidc, code flow with PKCE) matched by issuer + subject."""

from __future__ import annotations

import logging
from typing import Any, NoReturn
from urllib.parse import quote_plus, urlencode

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from requests.auth import HTTPBasicAuth

from tenants.models import User

from .discovery import (
    KeyChoiceError,
    ProviderError,
    choose_key,
    endpoints,
    forget_provider_metadata,
    jwks,
    token_auth_method,
)
from .services import (
    CONFUSABLE_MESSAGE,
    group_role_mapping,
    sso_login_refused,
    sso_new_username,
    sso_sync_memberships,
    sso_user_created,
)

logger = logging.getLogger(__name__)

CLASH_MESSAGE = (
    "The username “{username}” is already taken by another Camp account, so no account "
    "was created for this sign-in. Ask a platform admin to resolve the clash."
)
GENERIC_MESSAGE = "Single sign-on did not complete. Try again or ask a platform admin."
UNREACHABLE_MESSAGE = (
    "Camp could not reach the identity provider, so you were not signed in. Try again in a "
    "moment; if it keeps failing, tell a platform admin."
)
STATE_MESSAGE = (
    "This sign-in attempt is not one Camp started, or it was already used or has expired. "
    "Start again from this page."
)
UNVERIFIED_MESSAGE = (
    "The identity provider's answer could not be verified, so you were not signed in. "
    "A platform admin can find the reason in the audit log."
)
EXPIRED_MESSAGE = (
    "The identity provider's answer was expired or dated in the future (are the clocks of "
    "Camp and the provider in sync?), so you were not signed in."
)


class TokenRefused(SuspiciousOperation):
    """An ID token Camp will not accept; ``reason`` is audited, ``message`` is shown."""

    def __init__(self, reason: str, message: str = UNVERIFIED_MESSAGE) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message




def _public_numbers(jwk: jwt.PyJWK) -> Any:
    """What identifies a public key (to tell a refetched key from the cached one)."""
    public = getattr(jwk.key, "public_numbers", None)
    return public() if callable(public) else jwk.key


def _setting(name: str) -> Any:
    # Read at call time, so tests and settings overrides take effect per request.
    return getattr(settings, name)


def claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by name or dotted path (``realm_access.roles`` in Keycloak)."""
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def claim_groups(claims: dict[str, Any], path: str) -> set[str]:
    value = claim(claims, path)
    if isinstance(value, str):
        return {value}
    if isinstance(value, list | tuple):
        return {str(v) for v in value}
    return set()


class CampOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """Find the account by (issuer, subject) — never by e-mail — or create it; re-sync roles.

    Endpoints come from discovery at login time (tenants/sso/discovery.py); ID tokens are
    verified here against the cached JWKS, with Camp's audience, issuer and clock checks.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__: it reads endpoint URLs once from settings and refuses
        # an RS256 setup without a JWKS URL, but with discovery the endpoints are only
        # known at login time (and the provider may be down when Camp starts).
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = _setting("OIDC_RP_CLIENT_ID")
        self.OIDC_RP_CLIENT_SECRET = _setting("OIDC_RP_CLIENT_SECRET")
        self.OIDC_RP_SIGN_ALGO = _setting("OIDC_RP_SIGN_ALGO")
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.OIDC_OP_TOKEN_ENDPOINT = self.OIDC_OP_USER_ENDPOINT = ""
        self.OIDC_OP_JWKS_ENDPOINT = ""

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        # Password logins reach every backend too: only an OIDC callback is ours, and it
        # alone may cause network calls.
        if request is None or "username" in kwargs or "nonce" not in kwargs:
            return None
        if not (request.GET.get("code") and request.GET.get("state")):
            return None
        found = endpoints()  # ProviderError when the provider cannot be reached
        self.OIDC_OP_TOKEN_ENDPOINT = found.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = found.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = found.jwks_uri
        try:
            user: User | None = super().authenticate(request, **kwargs)
        except requests.RequestException as exc:
            # The cached endpoints may be stale (the provider moved): rediscover next time.
            forget_provider_metadata()
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status == 401:
                raise ProviderError(
                    "the token endpoint refused Camp's client authentication (401): check "
                    f"OIDC_CLIENT_SECRET and OIDC_TOKEN_AUTH_METHOD ({token_auth_method()})"
                ) from exc
            raise ProviderError(
                f"token or userinfo request failed ({type(exc).__name__}"
                f"{f' {status}' if status else ''})") from exc
        return user

    def retrieve_matching_jwk(self, token: str) -> jwt.PyJWK:
        """The JWKS key for ``token``; an unknown key refreshes the cached JWKS once."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.DecodeError as exc:
            raise TokenRefused("ID token is not a JWS") from exc
        alg, kid = header.get("alg"), header.get("kid")
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise TokenRefused(f"ID token algorithm {str(alg)[:16]!r} is not OIDC_SIGN_ALGO")
        kid = None if kid is None else str(kid)
        self._jwks_refreshed = False
        try:
            jwk = choose_key(jwks(self.OIDC_OP_JWKS_ENDPOINT)["keys"], kid=kid, alg=alg)
        except KeyChoiceError:
            # Key rotation: the provider may have published a key since the JWKS was cached.
            jwk = self._refreshed_key(kid, alg)
        return self._pyjwk(jwk, alg)

    def _refreshed_key(self, kid: str | None, alg: str) -> dict[str, Any]:
        """The key chosen from a freshly fetched JWKS (at most once per login)."""
        self._jwks_refreshed = True
        try:
            return choose_key(jwks(self.OIDC_OP_JWKS_ENDPOINT, refresh=True)["keys"],
                              kid=kid, alg=alg)
        except KeyChoiceError as exc:
            raise TokenRefused(exc.reason) from exc

    @staticmethod
    def _pyjwk(jwk: dict[str, Any], alg: str) -> jwt.PyJWK:
        try:
            return jwt.PyJWK(jwk, algorithm=alg)
        except jwt.PyJWTError as exc:
            raise TokenRefused("the provider's signing key is unusable") from exc

    def get_token(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The token request, authenticating the client as OIDC_TOKEN_AUTH_METHOD says.

        ``client_secret_basic`` (RFC 6749 §2.3.1: id and secret form-urlencoded, then HTTP
        Basic) or ``client_secret_post`` (both in the body).
        """
        auth = None
        if token_auth_method() == "client_secret_basic":
            payload = {k: v for k, v in payload.items() if k != "client_secret"}
            auth = HTTPBasicAuth(quote_plus(str(self.OIDC_RP_CLIENT_ID)),
                                 quote_plus(str(self.OIDC_RP_CLIENT_SECRET)))
        response = requests.post(
            self.OIDC_OP_TOKEN_ENDPOINT, data=payload, auth=auth,
            verify=_setting("OIDC_VERIFY_SSL"), timeout=_setting("OIDC_TIMEOUT"))
        self.raise_token_response_error(response)
        data: dict[str, Any] = response.json()
        return data

    def get_payload_data(self, token: str, key: Any) -> dict[str, Any]:
        """Verify signature, issuer, audience and times (OIDC Core §3.1.3.7), with leeway.

        Replaces the library's check, which skips the audience, never allows unsigned
        tokens here, and lets PyJWT's time errors escape as server errors.
        """
        jwk = key
        if isinstance(key, jwt.PyJWK):
            key = key.key
        try:
            payload: dict[str, Any] = jwt.decode(
                token, key, algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID, issuer=str(_setting("OIDC_ISSUER")),
                leeway=int(_setting("OIDC_CLOCK_SKEW_SECONDS")),
                options={"require": ["exp", "iat", "iss", "aud", "sub"]},
            )
        except jwt.ExpiredSignatureError as exc:
            raise TokenRefused("ID token expired", EXPIRED_MESSAGE) from exc
        except jwt.ImmatureSignatureError as exc:
            raise TokenRefused("ID token issued in the future beyond the allowed clock skew",
                               EXPIRED_MESSAGE) from exc
        except jwt.InvalidAudienceError as exc:
            raise TokenRefused("ID token audience does not include this client") from exc
        except jwt.InvalidIssuerError as exc:
            raise TokenRefused("ID token issuer does not match OIDC_ISSUER") from exc
        except jwt.InvalidSignatureError as exc:
            if isinstance(jwk, jwt.PyJWK) and not getattr(self, "_jwks_refreshed", True):
                # Verified with a cached key: the provider may have rotated its only key
                # (tokens without kid cannot say so). Fetch the JWKS once more and retry
                # with the key it gives, if that is another key.
                header = jwt.get_unverified_header(token)
                kid = header.get("kid")
                fresh = self._pyjwk(self._refreshed_key(None if kid is None else str(kid),
                                                        self.OIDC_RP_SIGN_ALGO),
                                    self.OIDC_RP_SIGN_ALGO)
                if fresh.key_id != jwk.key_id or _public_numbers(fresh) != _public_numbers(jwk):
                    return self.get_payload_data(token, fresh)
            raise TokenRefused("ID token signature does not verify") from exc
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"ID token invalid ({type(exc).__name__})") from exc
        audience = payload["aud"]
        # OIDC Core §3.1.3.7 (4, 5): with several audiences, azp must name this client.
        if isinstance(audience, list) and len(audience) > 1 and (
                payload.get("azp") != self.OIDC_RP_CLIENT_ID):
            raise TokenRefused("ID token has several audiences and azp is not this client")
        return payload

    def _refuse(self, username: str, reason: str, message: str = GENERIC_MESSAGE) -> NoReturn:
        sso_login_refused(request=getattr(self, "request", None), source="oidc",
                          username=username, reason=reason, message=message)
        raise SuspiciousOperation(reason)

    def get_or_create_user(self, access_token: str, id_token: str,
                           payload: dict[str, Any]) -> User | None:
        issuer = str(_setting("OIDC_ISSUER"))
        subject = str(payload.get("sub") or "")
        hint = str(payload.get(_setting("OIDC_USERNAME_CLAIM")) or subject)[:150]
        # Signature, issuer, audience and times were checked in get_payload_data, the
        # nonce by the library.
        if not subject:
            self._refuse(hint, "ID token has no subject")
        userinfo: dict[str, Any] = {}
        if self.OIDC_OP_USER_ENDPOINT:
            userinfo = self.get_userinfo(access_token, id_token, payload)
            if str(userinfo.get("sub", subject)) != subject:  # OIDC Core §5.3.2
                self._refuse(hint, "userinfo subject differs from the ID token subject")
        claims = {**payload, **userinfo}
        request = getattr(self, "request", None)
        if request is not None:  # the session's sid and sub, for back-channel logout
            request.camp_oidc_claims = {"sub": subject, "sid": payload.get("sid", "")}

        user, refusal = self._find_or_create(issuer, subject, claims)
        if refusal is not None:
            # Outside the transaction above, so the audit row of the refusal is kept.
            self._refuse(*refusal)
        return user

    @transaction.atomic
    def _find_or_create(self, issuer: str, subject: str, claims: dict[str, Any]
                        ) -> tuple[User | None, tuple[str, str, str] | None]:
        user = User.objects.select_for_update(no_key=True).filter(
            sso_issuer=issuer, sso_subject=subject).first()
        created = False
        if user is None:
            username, problem = sso_new_username(
                str(claim(claims, _setting("OIDC_USERNAME_CLAIM")) or subject))
            if not _setting("OIDC_CREATE_USER"):
                return None, (username, "no account for this identity and OIDC_CREATE_USER is off",
                              "You have no Camp account yet. Ask a platform admin.")
            if problem == "confusable username":
                return None, (username, problem, CONFUSABLE_MESSAGE.format(username=username))
            if problem is not None:
                return None, (username, problem, CLASH_MESSAGE.format(username=username))
            user = User(username=username, auth_source="oidc", sso_issuer=issuer,
                        sso_subject=subject)
            user.set_unusable_password()
            created = True
        self._fill(user, claims)
        user.save()
        if created:
            sso_user_created(user=user, source="oidc")
        groups = claim_groups(claims, _setting("OIDC_GROUPS_CLAIM"))
        sso_sync_memberships(user=user, grants=group_role_mapping().grants_for(groups),
                             source="oidc")
        return user, None

    @staticmethod
    def _fill(user: User, claims: dict[str, Any]) -> None:
        email = claims.get("email")
        if isinstance(email, str):
            user.email = email[:254]
        given, family = claims.get("given_name"), claims.get("family_name")
        if isinstance(given, str):
            user.first_name = given[:150]
        if isinstance(family, str):
            user.last_name = family[:150]
        if not isinstance(given, str) and isinstance(claims.get("name"), str):
            first, _, last = claims["name"].partition(" ")
            user.first_name, user.last_name = first[:150], last[:150]


def provider_logout_url(request: HttpRequest, post_logout_redirect: str) -> str | None:
    """Where to send the browser to end the provider's session too (RP-Initiated Logout 1.0).

    None when the provider offers no end_session_endpoint or cannot be reached: the
    Camp session ends either way.
    """
    if not (_setting("OIDC_ENABLED") and _setting("OIDC_LOGOUT_AT_PROVIDER")):
        return None
    try:
        endpoint = endpoints().end_session_endpoint
    except ProviderError as exc:
        logger.warning("No logout at the OpenID provider: %s", exc.reason)
        return None
    if not endpoint:
        return None
    params = {"client_id": str(_setting("OIDC_RP_CLIENT_ID")),
              "post_logout_redirect_uri": post_logout_redirect}
    id_token = request.session.get("oidc_id_token")
    if id_token:
        params["id_token_hint"] = str(id_token)
    return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(params)}"
