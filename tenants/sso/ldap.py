"""LDAP sign-in (django-auth-ldap) with the shared group → role mapping."""

from __future__ import annotations

import logging
from typing import Any

import ldap
from django.conf import settings
from django.db import transaction
from django.dispatch import receiver
from django_auth_ldap.backend import LDAPBackend, ldap_error

from tenants.models import User

from .services import group_role_mapping, sso_login_refused, sso_sync_memberships, sso_user_created

CLASH_MESSAGE = (
    "An account named “{username}” already exists in Camp but does not come from the "
    "directory, so it was not signed in. Ask a platform admin to resolve the clash."
)


UNAVAILABLE_MESSAGE = (
    "Camp could not sign you in because the directory is unavailable. This is not a wrong "
    "password and does not count against you: try again in a few minutes."
)

# The directory did not answer: not a verdict on the password (issue 31, item 2).
OUTAGE_ERRORS = (ldap.SERVER_DOWN, ldap.TIMEOUT, ldap.CONNECT_ERROR, ldap.UNAVAILABLE,
                 ldap.BUSY, ldap.TIMELIMIT_EXCEEDED)

logger = logging.getLogger(__name__)


@receiver(ldap_error)
def _note_outage(sender: Any, context: str, user: Any, request: Any, exception: Exception,
                 **kwargs: Any) -> None:
    """django-auth-ldap swallows LDAP errors; remember on the request that one was an outage."""
    if request is not None and isinstance(exception, OUTAGE_ERRORS):
        request.camp_directory_unavailable = True


def directory_unavailable(request: Any) -> bool:
    """Whether this login failed because the directory did not answer (not counted by axes)."""
    return bool(getattr(request, "camp_directory_unavailable", False))


def _rdn_value(dn: str) -> str:
    """``cn=acme-ml,ou=groups,dc=x`` → ``acme-ml`` (the name part of a group DN)."""
    first = dn.split(",", 1)[0]
    return first.split("=", 1)[1].strip() if "=" in first else first.strip()


class CampLDAPBackend(LDAPBackend):
    """Bind, search the user, then find or create the LDAP-sourced account and re-sync roles.

    Matching is by username among LDAP accounts only: a local or OIDC account with
    the same username (or e-mail) is never taken over.
    """

    def get_or_build_user(self, username: str, ldap_user: Any) -> tuple[User, bool]:
        username = username.lower()
        user = User.objects.filter(username__iexact=username).first()
        if user is None:
            ldap_user.camp_built = True
            return User(username=username, auth_source="ldap"), True
        if user.auth_source != "ldap":
            sso_login_refused(
                request=getattr(ldap_user, "_request", None), source="ldap", username=username,
                reason=f"username clash with a {user.auth_source} account",
                message=CLASH_MESSAGE.format(username=username),
            )
            raise ldap_user.AuthenticationFailed("username belongs to another source")
        return user, False

    def authenticate_ldap_user(self, ldap_user: Any, password: str) -> User | None:
        request = getattr(ldap_user, "_request", None)
        with transaction.atomic():
            user: User | None = super().authenticate_ldap_user(ldap_user, password)
            if user is None:
                if directory_unavailable(request):
                    self._refuse_outage(request, ldap_user)
                return None
            if getattr(ldap_user, "camp_built", False):
                sso_user_created(user=user, source="ldap")
            grants = group_role_mapping().grants_for(self.group_identifiers(ldap_user))
            sso_sync_memberships(user=user, grants=grants, source="ldap")
        return user

    @staticmethod
    def _refuse_outage(request: Any, ldap_user: Any) -> None:
        username = str(getattr(ldap_user, "_username", ""))
        if User.objects.filter(username__iexact=username).exclude(auth_source="ldap").exists():
            # Another source's account (a local one whose password the local backend
            # already refused): the directory's state changes nothing, it is a failure.
            request.camp_directory_unavailable = False
            return
        sso_login_refused(request=request, source="ldap", username=username,
                          reason="directory unavailable", message=UNAVAILABLE_MESSAGE)

    @staticmethod
    def group_identifiers(ldap_user: Any) -> set[str]:
        """Names and DNs of the user's groups, from a group search or ``memberOf``."""
        source = getattr(settings, "LDAP_GROUP_SOURCE", "search")
        if source == "none":
            return set()
        if source == "memberOf":
            attrs = ldap_user.attrs or {}
            values: list[Any] = next((v for k, v in attrs.items() if k.lower() == "memberof"), [])
            dns = [str(v) for v in values]
        else:
            dns = [str(v) for v in ldap_user.group_dns]
            return set(dns) | {str(n) for n in ldap_user.group_names}
        return set(dns) | {_rdn_value(dn) for dn in dns}
