"""Writes for the image catalog and external registries (``<entity>_<action>``,
keyword-only, explicit ``actor=``; access through ``tenants.permissions``; audited).

The owner of a row decides its scope: no tenant → platform (platform admins), a tenant →
that tenant (its owners), a project → that project (its admins). Registry passwords are
write-only: encrypted at rest, never returned, never in the audit log.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet

from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import Project, Tenant, User

from .crypto import decrypt_secret, encrypt_secret
from .models import PLATFORMS, ExternalRegistry, Image, Scope, Variant
from .references import ReferenceError, host_of, parse_reference

REGISTRY_FIELDS = ("scope", "tenant", "project", "name", "server", "username")
IMAGE_FIELDS = ("scope", "tenant", "project", "name", "display_name", "reference", "variant",
                "framework", "description", "registry", "architectures", "command", "run_as_user",
                "run_as_group", "home", "enabled")


def _require(actor: Any, action: str, obj: Any) -> None:
    if not permissions.can(actor, action, obj):
        raise PermissionDenied(f"You may not {action} this {obj._meta.verbose_name}.")


def _scope_of(tenant: Tenant | None, project: Project | None) -> tuple[str, Tenant | None]:
    if project is not None:
        if tenant is not None and project.tenant_id != tenant.pk:
            raise ValidationError({"project": ["This project belongs to another tenant."]})
        return Scope.PROJECT, project.tenant
    return (Scope.TENANT, tenant) if tenant is not None else (Scope.PLATFORM, None)


def _save(obj: Any, message: str) -> None:
    try:
        obj.full_clean(validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        raise ValidationError(exc.message_dict) from exc
    try:
        with transaction.atomic():
            obj.save()
    except IntegrityError as exc:
        raise ValidationError({"name": [message]}) from exc


def _registry_snapshot(r: ExternalRegistry) -> dict[str, Any]:
    return {**snapshot(r, REGISTRY_FIELDS), "has_credentials": r.has_credentials}


def _audit(actor: User, action: str, obj: Any, **extra: Any) -> None:
    audit_record(actor=actor, action=action, target=obj, tenant=obj.tenant, project=obj.project, **extra)


# --- registries ----------------------------------------------------------------------------


def _clean_server(server: str) -> str:
    host = host_of(server)
    if not host or " " in host:
        raise ValidationError({"server": [
            "Give the registry host, e.g. ghcr.io or registry.example.com:5000."]})
    try:
        parse_reference(f"{host}/x")
    except ReferenceError as exc:
        raise ValidationError({"server": [f"Not a registry host: {exc}"]}) from exc
    return host


@transaction.atomic
def registry_create(*, actor: User, name: str, server: str, username: str = "", password: str = "",
                    tenant: Tenant | None = None, project: Project | None = None) -> ExternalRegistry:
    scope, tenant = _scope_of(tenant, project)
    registry = ExternalRegistry(scope=scope, tenant=tenant, project=project, name=name,
                                server=server, username=username)
    _require(actor, permissions.CREATE, registry)
    registry.server = _clean_server(server)
    registry.password_encrypted = encrypt_secret(password)
    _save(registry, "A registry with this name already exists here.")
    _audit(actor, "registry.created", registry, after=_registry_snapshot(registry))
    return registry


@transaction.atomic
def registry_update(*, actor: User, registry: ExternalRegistry, password: str | None = None,
                    **changes: Any) -> ExternalRegistry:
    """``password`` None keeps the stored one; "" removes it."""
    _require(actor, permissions.CHANGE, registry)
    before = _registry_snapshot(registry)
    for key, value in changes.items():
        if key not in ("name", "server", "username"):
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(registry, key, value)
    registry.server = _clean_server(registry.server)
    if password is not None:
        registry.password_encrypted = encrypt_secret(password)
    _save(registry, "A registry with this name already exists here.")
    _audit(actor, "registry.updated", registry, before=before, after=_registry_snapshot(registry))
    return registry


@transaction.atomic
def registry_delete(*, actor: User, registry: ExternalRegistry) -> None:
    _require(actor, permissions.DELETE, registry)
    if registry.images.exists():
        raise ValidationError({"name": ["Images still pull from this registry."]})
    _audit(actor, "registry.deleted", registry, before=_registry_snapshot(registry))
    registry.delete()


def registries_for_project(project: Project) -> QuerySet[ExternalRegistry]:
    """Registries a project's workloads may pull with: the platform's, its tenant's, its own."""
    return ExternalRegistry.objects.filter(
        Q(scope=Scope.PLATFORM) | Q(scope=Scope.TENANT, tenant_id=project.tenant_id)
        | Q(scope=Scope.PROJECT, project=project))


def registry_for_reference(project: Project, reference: str) -> ExternalRegistry | None:
    """The most specific registry of the project whose host serves ``reference``."""
    try:
        host = parse_reference(reference).registry_host.lower()
    except ReferenceError:
        return None
    order = {Scope.PROJECT: 0, Scope.TENANT: 1, Scope.PLATFORM: 2}
    matches = [r for r in registries_for_project(project) if r.server == host and r.has_credentials]
    return min(matches, key=lambda r: (order[Scope(r.scope)], r.pk), default=None)


def pull_secret_manifest(registry: ExternalRegistry) -> dict[str, Any]:
    """The imagePullSecret for ``registry`` (the only place the password is decrypted)."""
    password = decrypt_secret(registry.password_encrypted)
    auth = base64.b64encode(f"{registry.username}:{password}".encode()).decode()
    config = {"auths": {registry.server: {"username": registry.username, "password": password,
                                          "auth": auth}}}
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": registry.secret_name, "labels": {"camp.io/registry": str(registry.pk)}},
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }


# --- images --------------------------------------------------------------------------------


def _clean_image(image: Image) -> None:
    try:
        parse_reference(image.reference)
    except ReferenceError as exc:
        raise ValidationError({"reference": [str(exc)]}) from exc
    image.reference = image.reference.strip()
    arches = image.architectures
    # Empty: unknown (images catalogued before architectures were recorded); no restriction.
    if (not isinstance(arches, list) or len(set(arches)) != len(arches)
            or not all(a in PLATFORMS for a in arches)):
        raise ValidationError({"architectures": [
            f"A list of the platforms the image is built for, among: {', '.join(PLATFORMS)}."]})
    if not isinstance(image.command, list) or not all(isinstance(c, str) and c for c in image.command):
        raise ValidationError({"command": ['A list of non-empty strings, e.g. ["start-notebook.py"].']})
    image.home = (image.home or "").strip()
    if image.home and (not image.home.startswith("/") or image.home == "/" or ".." in image.home.split("/")):
        raise ValidationError({"home": ["An absolute directory below /, e.g. /home/jovyan."]})
    if image.variant not in Variant.values:
        raise ValidationError({"variant": [f"Choose one of: {', '.join(Variant.values)}."]})
    r = image.registry
    if r is not None:
        usable = (r.scope == Scope.PLATFORM
                  or (r.scope == Scope.TENANT and r.tenant_id == image.tenant_id)
                  or (r.scope == Scope.PROJECT and r.project_id == image.project_id))
        if not usable:
            raise ValidationError({"registry": ["This registry cannot be used by this image's owner."]})
        if parse_reference(image.reference).registry_host.lower() != r.server:
            raise ValidationError({"registry": [f"The image is not on {r.server}."]})


@transaction.atomic
def image_create(*, actor: User, name: str, reference: str, variant: str, framework: str = "other",
                 display_name: str = "", description: str = "", registry: ExternalRegistry | None = None,
                 enabled: bool = True, tenant: Tenant | None = None,
                 project: Project | None = None, architectures: list[str] | None = None,
                 command: list[str] | None = None, run_as_user: int | None = None,
                 run_as_group: int | None = None, home: str = "") -> Image:
    scope, tenant = _scope_of(tenant, project)
    image = Image(scope=scope, tenant=tenant, project=project, name=name, reference=reference,
                  variant=variant, framework=framework, display_name=display_name,
                  description=description, registry=registry, enabled=enabled,
                  architectures=list(architectures) if architectures is not None else ["linux/amd64"],
                  command=list(command or []), run_as_user=run_as_user, run_as_group=run_as_group,
                  home=home)
    _require(actor, permissions.CREATE, image)
    _clean_image(image)
    _save(image, "An image with this name already exists here.")
    _audit(actor, "image.created", image, after=snapshot(image, IMAGE_FIELDS))
    return image


@transaction.atomic
def image_update(*, actor: User, image: Image, **changes: Any) -> Image:
    _require(actor, permissions.CHANGE, image)
    before = snapshot(image, IMAGE_FIELDS)
    for key, value in changes.items():
        if key not in ("name", "display_name", "reference", "variant", "framework", "description",
                       "registry", "architectures", "command", "run_as_user", "run_as_group", "home",
                       "enabled"):
            raise ValidationError({key: ["This field cannot be changed."]})
        setattr(image, key, value)
    _clean_image(image)
    _save(image, "An image with this name already exists here.")
    _audit(actor, "image.updated", image, before=before, after=snapshot(image, IMAGE_FIELDS))
    return image


@transaction.atomic
def image_delete(*, actor: User, image: Image) -> None:
    _require(actor, permissions.DELETE, image)
    _audit(actor, "image.deleted", image, before=snapshot(image, IMAGE_FIELDS))
    image.delete()


def images_for_project(project: Project, *, variant: str | None = None) -> QuerySet[Image]:
    """Enabled images a project may use: the platform's, its tenant's and its own."""
    qs = Image.objects.filter(enabled=True).filter(
        Q(scope=Scope.PLATFORM) | Q(scope=Scope.TENANT, tenant_id=project.tenant_id)
        | Q(scope=Scope.PROJECT, project=project)).select_related("registry")
    return qs.filter(variant=variant) if variant else qs
