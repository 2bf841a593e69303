"""OpenID Connect sign-in (mozilla-django-oidc, code flow with PKCE) matched by issuer + subject."""

from __future__ import annotations

import logging
import re
from typing import Any, NoReturn

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from tenants.models import User

from .services import group_role_mapping, sso_login_refused, sso_sync_memberships, sso_user_created

logger = logging.getLogger(__name__)

CLASH_MESSAGE = (
    "The username “{username}” is already taken by another Camp account, so no account "
    "was created for this sign-in. Ask a platform admin to resolve the clash."
)
GENERIC_MESSAGE = "Single sign-on did not complete. Try again or ask a platform admin."
_NOT_USERNAME = re.compile(r"[^\w.@+-]")


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
    """Find the account by (issuer, subject) — never by e-mail — or create it; re-sync roles."""

    def _refuse(self, username: str, reason: str, message: str = GENERIC_MESSAGE) -> NoReturn:
        sso_login_refused(request=getattr(self, "request", None), source="oidc",
                          username=username, reason=reason, message=message)
        raise SuspiciousOperation(reason)

    def get_or_create_user(self, access_token: str, id_token: str,
                           payload: dict[str, Any]) -> User | None:
        issuer = str(_setting("OIDC_ISSUER"))
        subject = str(payload.get("sub") or "")
        hint = str(payload.get(_setting("OIDC_USERNAME_CLAIM")) or subject)[:150]
        # The library checks signature, expiry and nonce; the issuer and audience
        # checks of OIDC Core §3.1.3.7 are ours.
        if payload.get("iss") != issuer:
            self._refuse(hint, "ID token issuer does not match OIDC_ISSUER")
        audience = payload.get("aud")
        audiences = [audience] if isinstance(audience, str) else list(audience or [])
        if self.OIDC_RP_CLIENT_ID not in audiences:
            self._refuse(hint, "ID token audience does not include this client")
        if not subject:
            self._refuse(hint, "ID token has no subject")
        userinfo: dict[str, Any] = {}
        if self.OIDC_OP_USER_ENDPOINT:
            userinfo = self.get_userinfo(access_token, id_token, payload)
            if str(userinfo.get("sub", subject)) != subject:  # OIDC Core §5.3.2
                self._refuse(hint, "userinfo subject differs from the ID token subject")
        claims = {**payload, **userinfo}

        user, refusal = self._find_or_create(issuer, subject, claims)
        if refusal is not None:
            # Outside the transaction above, so the audit row of the refusal is kept.
            self._refuse(*refusal)
        return user

    @transaction.atomic
    def _find_or_create(self, issuer: str, subject: str, claims: dict[str, Any]
                        ) -> tuple[User | None, tuple[str, str, str] | None]:
        user = User.objects.select_for_update().filter(
            sso_issuer=issuer, sso_subject=subject).first()
        created = False
        if user is None:
            username = _NOT_USERNAME.sub(
                "-", str(claim(claims, _setting("OIDC_USERNAME_CLAIM")) or subject))[:150]
            if not _setting("OIDC_CREATE_USER"):
                return None, (username, "no account for this identity and OIDC_CREATE_USER is off",
                              "You have no Camp account yet. Ask a platform admin.")
            if User.objects.filter(username__iexact=username).exists():
                return None, (username, "username clash with an existing account",
                              CLASH_MESSAGE.format(username=username))
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
