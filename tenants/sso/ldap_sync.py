"""LDAP re-sync: directories without SCIM deprovision through this (issue 31, item 5).

Every active directory account (``auth_source="ldap"``, keyed by its entry's DN) is read
again through django-auth-ldap with the service bind:

- its groups are mapped through ``SSO_GROUP_ROLES`` as at login, so a role whose group is
  gone is revoked (``sso_sync_memberships``);
- an entry the directory no longer has, or has locked (ppolicy ``pwdAccountLockedTime``),
  is deactivated through the one deprovisioning path (``deactivate_account``: sessions,
  API tokens, live pages), audited as ``sso:ldap``.

A directory that does not answer deactivates nobody: when the service bind or the search
base cannot be read the run is skipped and says so; an outage in the middle of a run skips
the accounts not yet read. Run by the beat every ``LDAP_SYNC_SECONDS`` and by
``manage.py ldap_sync``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import ldap
from django.conf import settings
from django.db import transaction
from django_auth_ldap.backend import _LDAPUser
from django_auth_ldap.config import LDAPSearch

from tenants.models import User

from .ldap import LDAP_ISSUER, OUTAGE_ERRORS, CampLDAPBackend
from .services import deactivate_account, group_role_mapping, sso_sync_memberships

logger = logging.getLogger(__name__)

ACTOR = "sso:ldap"
LOCK_ATTRIBUTE = "pwdAccountLockedTime"  # ppolicy (RFC draft behera), OpenLDAP and 389-ds
GONE = "removed from the directory"
LOCKED = "locked in the directory"


@dataclass
class LdapSyncReport:
    checked: int = 0
    roles_changed: list[str] = field(default_factory=list)  # "username: +grant -grant"
    deactivated: list[tuple[str, str]] = field(default_factory=list)  # (username, reason)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (username, why)
    error: str = ""  # the whole run was skipped (the directory did not answer)

    def as_dict(self) -> dict[str, Any]:
        return {"checked": self.checked, "roles_changed": self.roles_changed,
                "deactivated": [list(d) for d in self.deactivated],
                "skipped": [list(s) for s in self.skipped], "error": self.error}


def _describe(exc: Exception) -> str:
    info = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
    return f"{type(exc).__name__}: {info.get('desc', '') or exc}".rstrip(": ")


class _Directory:
    """One service-bound connection to the directory, shared by every account's read."""

    def __init__(self) -> None:
        self.backend = CampLDAPBackend()
        self.probe = _LDAPUser(self.backend, username="ldap-sync")

    def check(self) -> None:
        """Bind as the service account and read the user search base (raises LDAPError).

        A service account that lost its read rights sees no entry at all (the directory
        answers "no such object"): reading the base first tells that apart from a removal."""
        connection = self.probe.connection  # binds
        search = getattr(settings, "AUTH_LDAP_USER_SEARCH", None)
        base = getattr(search, "base_dn", "")
        if base:
            LDAPSearch(base, ldap.SCOPE_BASE, "(objectClass=*)", ["1.1"]).execute(connection)

    def read(self, user: User) -> tuple[_LDAPUser, dict[str, list[str]] | None]:
        """The account's entry (None when the directory no longer has it)."""
        ldap_user = _LDAPUser(self.backend, username=user.username)
        ldap_user._user_dn = user.sso_subject
        ldap_user._connection = self.probe._get_connection()
        ldap_user._connection_bound = True
        search = LDAPSearch(user.sso_subject, ldap.SCOPE_BASE, "(objectClass=*)",
                            ["*", "memberOf", LOCK_ATTRIBUTE])
        try:
            results = search.execute(ldap_user.connection)
        except ldap.NO_SUCH_OBJECT:
            return ldap_user, None
        if not results:
            return ldap_user, None
        attrs = results[0][1]
        ldap_user._user_attrs = attrs
        return ldap_user, attrs


def _locked(attrs: dict[str, list[str]]) -> bool:
    return any(k.lower() == LOCK_ATTRIBUTE.lower() and v for k, v in attrs.items())


def ldap_sync() -> LdapSyncReport:
    """Re-read every active directory account; see the module's docstring."""
    report = LdapSyncReport()
    if not getattr(settings, "LDAP_ENABLED", False):
        report.error = "LDAP sign-in is not enabled (LDAP_ENABLED)"
        return report
    directory = _Directory()
    try:
        directory.check()
    except ldap.LDAPError as exc:
        report.error = f"the directory is unavailable ({_describe(exc)}); nobody was changed"
        logger.warning("LDAP re-sync skipped: %s", report.error)
        return report
    mapping = group_role_mapping()
    accounts = (User.objects.filter(auth_source="ldap", sso_issuer=LDAP_ISSUER, is_active=True)
                .exclude(sso_subject="").order_by("pk"))
    for user in accounts.iterator():
        if report.error:
            report.skipped.append((user.username, "not read: the directory stopped answering"))
            continue
        try:
            ldap_user, attrs = directory.read(user)
            groups = (CampLDAPBackend.group_identifiers(ldap_user)
                      if attrs is not None and not _locked(attrs) else set())
        except OUTAGE_ERRORS as exc:
            report.error = (f"the directory stopped answering ({_describe(exc)}); "
                            "the accounts not yet read were not changed")
            report.skipped.append((user.username, _describe(exc)))
            continue
        except ldap.LDAPError as exc:
            report.skipped.append((user.username, _describe(exc)))
            continue
        report.checked += 1
        reason = GONE if attrs is None else LOCKED if _locked(attrs) else ""
        with transaction.atomic():
            if reason:
                deactivate_account(user=user, actor_username=ACTOR, reason=reason)
                user.refresh_from_db()
                report.deactivated.append((user.username, reason))
            result = sso_sync_memberships(user=user, grants=mapping.grants_for(groups),
                                          source="ldap")
        if result.granted or result.revoked or result.changed:
            parts = ([f"+{g}" for g in result.granted] + [f"-{g}" for g in result.revoked]
                     + [f"~{g}" for g in result.changed])
            report.roles_changed.append(f"{user.username}: {' '.join(parts)}")
    if report.error:
        logger.warning("LDAP re-sync stopped: %s", report.error)
    logger.info("LDAP re-sync: %d read, %d deactivated, %d role changes, %d skipped",
                report.checked, len(report.deactivated), len(report.roles_changed),
                len(report.skipped))
    return report
