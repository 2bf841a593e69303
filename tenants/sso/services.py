"""Writes for single sign-on: membership re-sync and refused logins, all audited.

The actor of these changes is the identity source, not a person: events carry no
actor id and ``actor_username`` ``sso:oidc`` / ``sso:ldap`` / ``sso:saml``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import ApiToken, Membership, Project, Tenant, User
from tenants.services import MEMBERSHIP_FIELDS, TOKEN_FIELDS, USER_FIELDS
from tenants.validators import canonical_username, confusable_username_reason

from .mapping import (
    PLATFORM_ADMIN,
    PROJECT_ROLE_RANK,
    TENANT_OWNER,
    Grant,
    GroupRoleMapping,
    parse_group_roles,
)

logger = logging.getLogger(__name__)

SOURCES = ("ldap", "oidc", "saml", "scim")  # scim: tenants/scim (provisioning)

_NOT_USERNAME = re.compile(r"[^\w.@+-]")
CONFUSABLE_MESSAGE = (
    "The username “{username}” mixes letters of several scripts and could pass for another "
    "person's name, so no account was created. Ask a platform admin."
)


def sso_new_username(hint: str) -> tuple[str, str | None]:
    """The canonical username for a new SSO account, and what stops it (None, or a reason).

    The identity provider's name is only a label: accounts are found by their stable
    identifier (issuer + subject, IdP + NameID, directory DN). Normalised once, like every
    other entrance (NFKC + case folding), so `ｖｉｃｔｉｍ` is `victim` and clashes with it.
    """
    username = canonical_username(_NOT_USERNAME.sub("-", canonical_username(hint)))[:150]
    if confusable_username_reason(username):
        return username, "confusable username"
    if User.objects.filter(username__iexact=username).exists():
        return username, "username clash with an existing account"
    return username, None


def group_role_mapping() -> GroupRoleMapping:
    value = getattr(settings, "SSO_GROUP_ROLES", None)
    if isinstance(value, GroupRoleMapping):
        return value
    return parse_group_roles(value or "")


@dataclass
class SyncResult:
    granted: list[str] = field(default_factory=list)
    revoked: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _actor_name(source: str) -> str:
    return f"sso:{source}"


def _audit_membership(action: str, membership: Membership, source: str,
                      before: dict[str, Any] | None = None,
                      after: dict[str, Any] | None = None) -> None:
    audit_record(actor=None, actor_username=_actor_name(source), action=action, target=membership,
                 tenant=membership.tenant, project=membership.project, before=before,
                 after=after)


@transaction.atomic
def sso_sync_memberships(*, user: User, grants: set[Grant], source: str) -> SyncResult:
    """Make the user's SSO-granted roles equal ``grants``; audit each change.

    Only roles SSO granted before (``user.sso_grants``) are ever revoked, so roles
    a tenant owner gave by hand survive a login. A grant naming a tenant or
    project that does not exist is skipped (and logged): SSO never creates tenants.
    """
    assert source in SOURCES
    result = SyncResult()
    previous = set(user.sso_grants or [])
    applied: set[str] = set()

    # Platform admin: granted by a group, revoked only if a group had granted it.
    want_admin = any(g.role == PLATFORM_ADMIN for g in grants)
    if want_admin != user.is_platform_admin and (want_admin or PLATFORM_ADMIN in previous):
        before = snapshot(user, USER_FIELDS)
        user.is_platform_admin = want_admin
        user.save(update_fields=["is_platform_admin"])
        audit_record(actor=None, actor_username=_actor_name(source), action="user.updated",
                     target=user, before=before,
                     after={**snapshot(user, USER_FIELDS), "via": source})
        (result.granted if want_admin else result.revoked).append(PLATFORM_ADMIN)
    if want_admin:
        applied.add(PLATFORM_ADMIN)

    # Tenant owners.
    tenants = {t.name: t for t in Tenant.objects.filter(
        name__in={g.tenant for g in grants if g.tenant})}
    want_owner: dict[int, Tenant] = {}
    for grant in grants:
        if grant.role != TENANT_OWNER:
            continue
        tenant = tenants.get(grant.tenant)
        if tenant is None:
            result.unknown.append(grant.key)
            continue
        want_owner[tenant.pk] = tenant
        applied.add(grant.key)

    # Project roles: the highest role per project wins.
    project_keys = {(g.tenant, g.project) for g in grants if g.role in PROJECT_ROLE_RANK}
    projects = {
        (p.tenant.name, p.name): p
        for p in Project.objects.select_related("tenant").filter(
            tenant__name__in={t for t, _ in project_keys}, name__in={n for _, n in project_keys})
    }
    want_project: dict[int, tuple[Project, str]] = {}
    for grant in sorted(grants):
        if grant.role not in PROJECT_ROLE_RANK:
            continue
        project = projects.get((grant.tenant, grant.project))
        if project is None:
            result.unknown.append(grant.key)
            continue
        current = want_project.get(project.pk)
        if current is None or PROJECT_ROLE_RANK[grant.role] > PROJECT_ROLE_RANK[current[1]]:
            want_project[project.pk] = (project, grant.role)
    for project, role in want_project.values():
        applied.add(Grant(role, project.tenant.name, project.name).key)

    existing = list(Membership.objects.select_related("tenant", "project").filter(user=user))
    owned = {m.tenant_id: m for m in existing if m.project_id is None}
    in_project = {m.project_id: m for m in existing if m.project_id is not None}

    for tenant_id, tenant in want_owner.items():
        if tenant_id not in owned:
            m = Membership.objects.create(user=user, tenant=tenant, role=TENANT_OWNER)
            _audit_membership("membership.created", m, source,
                              after={**snapshot(m, MEMBERSHIP_FIELDS), "via": source})
            result.granted.append(f"{TENANT_OWNER}:{tenant.name}")
    for project_id, (project, role) in want_project.items():
        m_or_none = in_project.get(project_id)
        if m_or_none is None:
            m = Membership.objects.create(user=user, tenant=project.tenant, project=project,
                                          role=role)
            _audit_membership("membership.created", m, source,
                              after={**snapshot(m, MEMBERSHIP_FIELDS), "via": source})
            result.granted.append(f"{role}:{project}")
        elif m_or_none.role != role:
            before = snapshot(m_or_none, MEMBERSHIP_FIELDS)
            m_or_none.role = role
            m_or_none.save(update_fields=["role"])
            _audit_membership("membership.updated", m_or_none, source, before=before,
                              after={**snapshot(m_or_none, MEMBERSHIP_FIELDS), "via": source})
            result.changed.append(f"{role}:{project}")

    # Revoke what SSO granted before and no group grants now.
    for key in sorted(previous - applied):
        if key == PLATFORM_ADMIN:
            continue
        grant = Grant.parse(key)
        if grant.role == TENANT_OWNER:
            victim = next((m for m in owned.values() if m.tenant.name == grant.tenant), None)
            if victim is None or victim.tenant_id in want_owner:
                continue
        else:
            victim = next((m for m in in_project.values() if m.project is not None
                           and m.tenant.name == grant.tenant
                           and m.project.name == grant.project), None)
            # Kept if a group still grants a role there (it was updated above) or
            # someone changed the role by hand since SSO granted it.
            if victim is None or victim.project_id in want_project or victim.role != grant.role:
                continue
        _audit_membership("membership.deleted", victim, source,
                          before={**snapshot(victim, MEMBERSHIP_FIELDS), "via": source})
        victim.delete()
        result.revoked.append(key)

    if result.unknown:
        logger.warning("SSO grants for %s name unknown tenants/projects: %s",
                       user.get_username(), ", ".join(sorted(result.unknown)))
    new_grants = sorted(applied)
    if new_grants != sorted(previous):
        user.sso_grants = new_grants
        user.save(update_fields=["sso_grants"])
    permissions.forget_scope(user)
    return result


def sso_user_created(*, user: User, source: str) -> None:
    audit_record(actor=None, actor_username=_actor_name(source), action="user.created",
                 target=user, after={**snapshot(user, USER_FIELDS), "auth_source": source})


def sso_login_refused(*, request: Any, source: str, username: str, reason: str,
                      message: str) -> None:
    """Audit a refused SSO login and keep a message for the login page.

    ``reason`` is a short machine-readable code; ``message`` is what the person sees.
    Neither may contain tokens or passwords.
    """
    audit_record(actor=None, actor_username=username[:150], action="auth.login_refused",
                 target_repr=username[:255], after={"source": source, "reason": reason})
    logger.warning("Refused %s login for %r: %s", source, username, reason)
    if request is not None:
        request.camp_login_error = message


@transaction.atomic
def deactivate_account(*, user: User, actor_username: str, reason: str) -> int:
    """The identity source removed or locked this person: the account stops at once.

    The one deprovisioning path (SCIM ``active=false``/DELETE, the LDAP re-sync): the
    account is made inactive, every session ends, every API token is revoked (each
    audited) and the person's open live pages are closed; one ``user.deactivated`` event
    names the source (``actor_username``, e.g. ``scim:okta`` or ``sso:ldap``) and the
    reason. Roles are the caller's to re-sync (they depend on the source's groups).
    Returns the number of API tokens revoked.

    Sessions: Django checks each session against a hash of the password field at every
    request (``get_session_auth_hash``); a new unusable password changes it, so every
    existing session is refused (and flushed) at its very next request, whichever
    backend signed it in. Such accounts have no password to lose: they sign in through
    the identity source."""
    user = User.objects.select_for_update().get(pk=user.pk)
    before = snapshot(user, USER_FIELDS)
    user.is_active = False
    user.set_unusable_password()
    user.save(update_fields=["is_active", "password"])
    now = timezone.now()
    revoked = 0
    for token in ApiToken.objects.select_related("project__tenant").filter(
            user=user, revoked_at__isnull=True):
        token.revoked_at = now
        token.save(update_fields=["revoked_at"])
        audit_record(actor=None, actor_username=actor_username, action="token.revoked",
                     target=token, tenant=token.project.tenant if token.project else None,
                     project=token.project,
                     before={**snapshot(token, TOKEN_FIELDS), "via": actor_username})
        revoked += 1
    audit_record(actor=None, actor_username=actor_username, action="user.deactivated",
                 target=user, before=before,
                 after={**snapshot(user, USER_FIELDS), "via": actor_username,
                        "reason": reason, "sessions_ended": True,
                        "api_tokens_revoked": revoked})
    from tenants.sockets import close_user_sockets

    transaction.on_commit(lambda: close_user_sockets(user.pk))
    permissions.forget_scope(user)
    return revoked
