"""Shared fixtures: two tenants, each with users of every role, plus an outsider.

The tenant fixture follows DESIGN.md §5: owner, project admin, member, outsider
per tenant, and one platform admin.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

PASSWORD = "correct-horse-battery-staple"


@dataclass
class TenantWorld:
    tenant: Any
    project: Any
    other_project: Any
    owner: Any
    project_admin: Any
    member: Any


@dataclass
class World:
    admin: Any
    a: TenantWorld
    b: TenantWorld
    outsider: Any

    def user(self, role: str, side: str = "a") -> Any:
        if role == "platform_admin":
            return self.admin
        if role == "outsider":
            return self.outsider
        return getattr(getattr(self, side), role)


def make_user(username: str, **extra: Any) -> Any:
    from tenants.models import User

    user = User(username=username, email=f"{username}@example.test", **extra)
    user.set_password(PASSWORD)
    user.save()
    return user


def _tenant_world(admin: Any, name: str) -> TenantWorld:
    from tenants import services
    from tenants.models import Role

    tenant = services.tenant_create(actor=admin, name=name)
    owner = make_user(f"{name}-owner")
    services.membership_create(actor=admin, user=owner, tenant=tenant, role=Role.TENANT_OWNER)
    project = services.project_create(actor=owner, tenant=tenant, name=f"{name}-p1")
    other = services.project_create(actor=owner, tenant=tenant, name=f"{name}-p2")
    padmin = make_user(f"{name}-padmin")
    member = make_user(f"{name}-member")
    services.membership_create(actor=owner, user=padmin, tenant=tenant, project=project,
                               role=Role.PROJECT_ADMIN)
    services.membership_create(actor=owner, user=member, tenant=tenant, project=project,
                               role=Role.PROJECT_MEMBER)
    for u in (owner, padmin, member):
        u.refresh_from_db()
    return TenantWorld(tenant, project, other, owner, padmin, member)


@pytest.fixture
def world(db: Any) -> World:
    # Transactional tests flush the database, which also removes the base images that a
    # migration seeds; put them back (idempotent) so every test sees the real catalog.
    from registry.catalog import seed_base_images
    from registry.models import Image

    seed_base_images(Image)
    admin = make_user("root-admin", is_platform_admin=True)
    a = _tenant_world(admin, "acme")
    b = _tenant_world(admin, "globex")
    outsider = make_user("outsider")
    return World(admin=admin, a=a, b=b, outsider=outsider)


@pytest.fixture
def api() -> Any:
    from rest_framework.test import APIClient

    return APIClient()


def client_for(user: Any) -> Any:
    """An API client with a real session for ``user`` (each request loads the user anew)."""
    from rest_framework.test import APIClient

    client = APIClient()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture(autouse=True)
def _no_frozen_heap_after_a_test() -> Any:
    """A test that imports ``camp.asgi`` freezes this whole pytest process's heap (camp/heap.py,
    as a served process does once loaded): give it back to the collector afterwards, so what
    that test and later ones drop in a cycle is collected and no test depends on which one
    happened to import it first."""
    yield
    import gc

    if gc.get_freeze_count():
        gc.unfreeze()
