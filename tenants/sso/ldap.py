"""LDAP sign-in (django-auth-ldap) with the shared group → role mapping."""

from __future__ import annotations

import logging
from typing import Any

import ldap
import ldap.dn
from django.conf import settings
from django.db import transaction
from django.dispatch import receiver
from django_auth_ldap.backend import LDAPBackend, ldap_error

from tenants.models import User

from .services import (
    CONFUSABLE_MESSAGE,
    group_role_mapping,
    sso_login_refused,
    sso_new_username,
    sso_sync_memberships,
    sso_user_created,
)

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


LDAP_ISSUER = "ldap"  # User.sso_issuer of directory accounts; sso_subject is the entry's DN


def directory_key(dn: str) -> str:
    """A DN in one spelling (spacing and case of attribute types and values folded)."""
    try:
        return ldap.dn.dn2str(ldap.dn.str2dn(dn)).casefold()
    except ldap.DECODING_ERROR:
        return dn.casefold()


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
        # The account is the directory entry (its DN), not the name typed: every spelling
        # the directory resolves to one entry is one Camp account.
        subject = directory_key(ldap_user.dn)
        user = User.objects.filter(auth_source="ldap", sso_issuer=LDAP_ISSUER,
                                   sso_subject=subject).first()
        if user is not None:
            return user, False
        request = getattr(ldap_user, "_request", None)
        username, problem = sso_new_username(username)
        user = User.objects.filter(username__iexact=username).first()
        if user is None:
            if problem == "confusable username":
                sso_login_refused(request=request, source="ldap", username=username,
                                  reason=problem, message=CONFUSABLE_MESSAGE.format(username=username))
                raise ldap_user.AuthenticationFailed(problem)
            ldap_user.camp_built = True
            return User(username=username, auth_source="ldap", sso_issuer=LDAP_ISSUER,
                        sso_subject=subject), True
        if user.auth_source != "ldap" or user.sso_subject not in ("", subject):
            what = (f"a {user.auth_source} account" if user.auth_source != "ldap"
                    else "another directory entry's account")
            sso_login_refused(
                request=request, source="ldap", username=username,
                reason=f"username clash with {what}",
                message=CLASH_MESSAGE.format(username=username),
            )
            raise ldap_user.AuthenticationFailed("username belongs to another account")
        # An LDAP account from before accounts were keyed by DN: it is this entry's now.
        user.sso_issuer, user.sso_subject = LDAP_ISSUER, subject
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
