"""Access rules of the image catalog (tenants/permissions.py explains the rules).

Registered from ``RegistryConfig.ready()``.
"""

from __future__ import annotations

from tenants.permissions import (
    PROJECT_ADMIN,
    PROJECT_MEMBER,
    TENANT_MEMBER,
    TENANT_OWNER,
    PlatformOnly,
    ProjectScoped,
    TenantScoped,
    Tiered,
    register,
)

from .models import ExternalRegistry, Image, Scope

# Images and registries belong to the platform (admins manage, every tenant member reads),
# a tenant (its owners manage, its members read) or a project (its admins manage, its
# members read); the row's ``scope`` says which.
CATALOG_RULE = Tiered("scope", {
    Scope.PLATFORM: PlatformOnly(view=TENANT_MEMBER),
    Scope.TENANT: TenantScoped(view=TENANT_MEMBER, create=TENANT_OWNER, change=TENANT_OWNER,
                               delete=TENANT_OWNER),
    Scope.PROJECT: ProjectScoped(view=PROJECT_MEMBER, create=PROJECT_ADMIN, change=PROJECT_ADMIN,
                                 delete=PROJECT_ADMIN),
})


def register_rules() -> None:
    register(Image, CATALOG_RULE)
    register(ExternalRegistry, CATALOG_RULE)
