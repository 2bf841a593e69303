"""The one group → role mapping shared by OIDC and LDAP (pure Python, no Django models).

``SSO_GROUP_ROLES`` is a JSON object: each key is a group as the identity source
names it (an OIDC groups-claim value, an LDAP group cn or DN), each value a grant
or a list of grants::

    {"camp-admins": "platform_admin",
     "acme-owners": "tenant_owner:acme",
     "acme-ml-leads": "project_admin:acme/ml",
     "acme-ml": ["project_member:acme/ml", "project_member:acme/vision"]}

Group names match case-insensitively (LDAP DNs and AD group names are
case-insensitive; IdPs rarely vary case on purpose).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

PLATFORM_ADMIN = "platform_admin"
TENANT_OWNER = "tenant_owner"
PROJECT_ADMIN = "project_admin"
PROJECT_MEMBER = "project_member"
ROLES = (PLATFORM_ADMIN, TENANT_OWNER, PROJECT_ADMIN, PROJECT_MEMBER)
# Higher wins when two groups give one user two roles in the same project.
PROJECT_ROLE_RANK = {PROJECT_ADMIN: 2, PROJECT_MEMBER: 1}


class MappingError(ValueError):
    """The mapping text is malformed; the message names the bad entry."""


@dataclass(frozen=True, order=True)
class Grant:
    """One role in one place: platform-wide, a tenant, or a tenant's project."""

    role: str
    tenant: str = ""
    project: str = ""

    @property
    def key(self) -> str:
        if self.role == PLATFORM_ADMIN:
            return PLATFORM_ADMIN
        if self.role == TENANT_OWNER:
            return f"{TENANT_OWNER}:{self.tenant}"
        return f"{self.role}:{self.tenant}/{self.project}"

    @classmethod
    def parse(cls, text: str) -> Grant:
        role, _, where = text.strip().partition(":")
        role = role.strip()
        tenant, _, project = where.strip().partition("/")
        tenant, project = tenant.strip(), project.strip()
        if role == PLATFORM_ADMIN and not where:
            return cls(PLATFORM_ADMIN)
        if role == TENANT_OWNER and tenant and not project:
            return cls(TENANT_OWNER, tenant)
        if role in PROJECT_ROLE_RANK and tenant and project:
            return cls(role, tenant, project)
        raise MappingError(
            f"{text!r} is not a grant; use platform_admin, tenant_owner:<tenant>, "
            "project_admin:<tenant>/<project> or project_member:<tenant>/<project>"
        )


@dataclass(frozen=True)
class GroupRoleMapping:
    entries: tuple[tuple[str, Grant], ...] = ()

    def grants_for(self, groups: Iterable[str]) -> set[Grant]:
        """Every grant of every group the user is in."""
        have = {g.casefold() for g in groups}
        return {grant for group, grant in self.entries if group.casefold() in have}

    def __bool__(self) -> bool:
        return bool(self.entries)


def parse_group_roles(text: str, *, name: str = "SSO_GROUP_ROLES") -> GroupRoleMapping:
    """Parse the JSON mapping; raise MappingError naming ``name`` and the bad part."""
    if not text.strip():
        return GroupRoleMapping()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MappingError(f"{name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise MappingError(f"{name} must be a JSON object of group → grant(s)")
    entries: list[tuple[str, Grant]] = []
    for group, value in data.items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if not isinstance(item, str):
                raise MappingError(f"{name}: grants of {group!r} must be strings")
            try:
                entries.append((str(group), Grant.parse(item)))
            except MappingError as exc:
                raise MappingError(f"{name}: group {group!r}: {exc}") from exc
    return GroupRoleMapping(tuple(entries))
