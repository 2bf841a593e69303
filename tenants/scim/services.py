"""What a SCIM call does to Camp: accounts, deprovisioning and roles, all audited.

The actor of every change is the identity provider: audit events carry no actor id and
``actor_username`` ``scim:<provider>``. Roles go through the one group → role mapping
(``SSO_GROUP_ROLES``, ``tenants.sso.services.sso_sync_memberships``), with the names of the
provider's groups the user is a member of.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django_scim import exceptions as scim_errors

from tenants.audit import audit_record, snapshot
from tenants.models import User
from tenants.services import USER_FIELDS, hash_token
from tenants.sso.services import deactivate_account, group_role_mapping, sso_sync_memberships

from .models import ScimGroup, ScimProvider, ScimToken, ScimUser

SCIM_TOKEN_PREFIX = "campscim_"  # noqa: S105 (a public marker, not a secret)
SCIM_SOURCE = "scim"


def actor_name(provider: ScimProvider) -> str:
    return f"scim:{provider.name}"


# --- credentials ------------------------------------------------------------------------


def scim_provider_for(name: str, sso_source: str | None, sso_issuer: str | None) -> ScimProvider:
    """The provider named ``name``, created with its single sign-on binding if new.

    An existing provider keeps its binding: changing it would orphan every account it
    provisioned (they would no longer sign in). Raises ValidationError naming the field."""
    provider = ScimProvider.objects.filter(name=name).first()
    if provider is None:
        if not sso_source or not sso_issuer:
            raise ValidationError({"sso_source": [
                "sso_source and sso_issuer are required for a new provider."]})
        provider = ScimProvider(name=name, sso_source=sso_source, sso_issuer=sso_issuer)
        provider.full_clean()
        provider.save()
    elif (sso_source and sso_source != provider.sso_source) or (
            sso_issuer and sso_issuer != provider.sso_issuer):
        raise ValidationError({"provider": [
            f"{provider.name!r} is bound to {provider.sso_source} {provider.sso_issuer}; "
            "its accounts would no longer sign in."]})
    return provider


@transaction.atomic
def scim_token_create(*, actor: User | None, provider: ScimProvider) -> tuple[ScimToken, str]:
    """A new bearer token for ``provider``; returns the row and the plaintext (shown once).

    The prefix differs from API tokens' ``camp_``, and the two live in different tables:
    an API token is unknown to /scim and a SCIM token is unknown to /api/v1."""
    public = secrets.token_hex(4)
    plaintext = f"{SCIM_TOKEN_PREFIX}{public}_{secrets.token_urlsafe(32)}"
    token = ScimToken.objects.create(provider=provider, prefix=f"{SCIM_TOKEN_PREFIX}{public}",
                                     key_hash=hash_token(plaintext), created_by=actor)
    audit_record(actor=actor, actor_username=None if actor else "manage.py",
                 action="scim_token.created", target=token,
                 after={"provider": provider.name, "prefix": token.prefix,
                        "sso_source": provider.sso_source, "sso_issuer": provider.sso_issuer})
    return token, plaintext


@transaction.atomic
def scim_token_revoke(*, actor: User | None, token: ScimToken) -> None:
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
        audit_record(actor=actor, actor_username=None if actor else "manage.py",
                     action="scim_token.revoked", target=token,
                     before={"provider": token.provider.name, "prefix": token.prefix})


def scim_token_authenticate(plaintext: str) -> ScimToken | None:
    """The live SCIM token for ``plaintext``, or None."""
    if not plaintext.startswith(SCIM_TOKEN_PREFIX):
        return None
    token = (ScimToken.objects.select_related("provider")
             .filter(key_hash=hash_token(plaintext), revoked_at__isnull=True).first())
    if token is None:
        return None
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ScimToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


# --- users ------------------------------------------------------------------------------


@dataclass
class UserFields:
    """The attributes Camp keeps from a SCIM User (others are accepted and ignored)."""

    user_name: str
    external_id: str = ""
    email: str = ""
    first_name: str = ""
    last_name: str = ""
    active: bool = True


def _bad(detail: str, scim_type: str = "invalidValue") -> scim_errors.BadRequestError:
    return scim_errors.BadRequestError(detail, scim_type=scim_type)


def _conflict(detail: str) -> scim_errors.IntegrityError:
    return scim_errors.IntegrityError(detail, scim_type="uniqueness")


def _check_user_fields(fields: UserFields) -> None:
    if not fields.user_name.strip():
        raise _bad("userName is required.")
    if len(fields.user_name) > 150:
        raise _bad("userName is longer than 150 characters.")
    if len(fields.external_id) > 255:
        raise _bad("externalId is longer than 255 characters.")


def _apply_to_user(user: User, fields: UserFields) -> None:
    user.username = fields.user_name
    user.email = fields.email
    user.first_name = fields.first_name[:150]
    user.last_name = fields.last_name[:150]
    try:
        user.full_clean(exclude=["password"], validate_unique=False, validate_constraints=False)
    except ValidationError as exc:
        named = {"username": "userName", "email": "emails", "first_name": "name.givenName",
                 "last_name": "name.familyName"}
        errors = exc.message_dict
        field = next(iter(errors))
        raise _bad(f"{named.get(field, field)}: {' '.join(errors[field])}") from exc


def _username_taken(username: str, exclude_pk: int | None) -> bool:
    qs = User.objects.filter(username__iexact=username)
    if exclude_pk is not None:
        qs = qs.exclude(pk=exclude_pk)
    return qs.exists()


@transaction.atomic
def provision_user(*, provider: ScimProvider, fields: UserFields) -> ScimUser:
    """Create (or adopt) the Camp account for a SCIM User.

    The account is keyed by provider + externalId, and its single sign-on identity is
    the provider's issuer + externalId (the userName when no externalId is sent), so
    the person's first SSO login finds this account. An account that already signs in
    with exactly that identity (it logged in before provisioning was switched on) is
    adopted. Any other account with the same username is never merged: 409.
    """
    _check_user_fields(fields)
    links = ScimUser.objects.filter(provider=provider)
    if fields.external_id and links.filter(external_id=fields.external_id).exists():
        raise _conflict(f"A user with externalId {fields.external_id!r} already exists.")
    if links.filter(user_name__iexact=fields.user_name).exists():
        raise _conflict(f"A user with userName {fields.user_name!r} already exists.")
    subject = fields.external_id or fields.user_name
    user = (User.objects.select_for_update(of=("self",))
            .filter(auth_source=provider.sso_source, sso_issuer=provider.sso_issuer,
                    sso_subject=subject, scim_link__isnull=True).first())
    adopted = user is not None
    if user is None:
        if _username_taken(fields.user_name, None):
            raise _conflict(f"userName {fields.user_name!r} belongs to another Camp account; "
                            "a platform admin must rename or remove one of them.")
        user = User(auth_source=provider.sso_source, sso_issuer=provider.sso_issuer,
                    sso_subject=subject)
        user.set_unusable_password()
    elif _username_taken(fields.user_name, user.pk):
        raise _conflict(f"userName {fields.user_name!r} belongs to another Camp account.")
    before = snapshot(user, USER_FIELDS) if adopted else None
    _apply_to_user(user, fields)
    user.is_active = True
    try:
        with transaction.atomic():
            user.save()
            link = ScimUser.objects.create(provider=provider, user=user,
                                           external_id=fields.external_id,
                                           user_name=fields.user_name)
    except IntegrityError as exc:
        raise _conflict("userName or externalId is already in use.") from exc
    audit_record(actor=None, actor_username=actor_name(provider),
                 action="user.updated" if adopted else "user.created", target=user,
                 before=before,
                 after={**snapshot(user, USER_FIELDS), "via": actor_name(provider),
                        "auth_source": user.auth_source, "external_id": fields.external_id})
    if not fields.active:
        deactivate(link)
    else:
        sync_roles(link)
    return link


@transaction.atomic
def update_user(*, link: ScimUser, fields: UserFields) -> ScimUser:
    """Replace the attributes Camp keeps (PUT, or PATCH after applying its operations)."""
    _check_user_fields(fields)
    provider, user = link.provider, User.objects.select_for_update().get(pk=link.user_id)
    link.user = user
    others = ScimUser.objects.filter(provider=provider).exclude(pk=link.pk)
    if fields.external_id and others.filter(external_id=fields.external_id).exists():
        raise _conflict(f"A user with externalId {fields.external_id!r} already exists.")
    if _username_taken(fields.user_name, user.pk):
        raise _conflict(f"userName {fields.user_name!r} belongs to another Camp account.")
    before = snapshot(user, USER_FIELDS)
    was_active = user.is_active
    _apply_to_user(user, fields)
    if fields.external_id and fields.external_id != link.external_id:
        user.sso_subject = fields.external_id
    try:
        with transaction.atomic():
            user.save()
            link.external_id, link.user_name = fields.external_id, fields.user_name
            link.save()
    except IntegrityError as exc:
        raise _conflict("userName or externalId is already in use.") from exc
    after = snapshot(user, USER_FIELDS)
    if after != before:
        audit_record(actor=None, actor_username=actor_name(provider), action="user.updated",
                     target=user, before=before, after={**after, "via": actor_name(provider)})
    if was_active and not fields.active:
        deactivate(link)
    elif not was_active and fields.active:
        reactivate(link)
    return link


@transaction.atomic
def deactivate(link: ScimUser) -> None:
    """active=false: the account stops at once (sessions, API tokens, live pages: the one
    deprovisioning path, ``tenants.sso.services.deactivate_account``) and loses the roles
    its groups gave it."""
    deactivate_account(user=link.user, actor_username=actor_name(link.provider),
                       reason="deactivated by the identity provider (SCIM)")
    link.user.refresh_from_db()
    sync_roles(link)


@transaction.atomic
def reactivate(link: ScimUser) -> None:
    provider = link.provider
    user = link.user
    before = snapshot(user, USER_FIELDS)
    user.is_active = True
    user.save(update_fields=["is_active"])
    sync_roles(link)
    audit_record(actor=None, actor_username=actor_name(provider), action="user.reactivated",
                 target=user, before=before,
                 after={**snapshot(user, USER_FIELDS), "via": actor_name(provider)})


@transaction.atomic
def deprovision(link: ScimUser) -> None:
    """DELETE: deactivate (as above), leave the provider's groups and forget the link.

    The Camp account itself is kept, inactive: its jobs, workspaces and audit history
    stay attributable. Provisioning the same externalId again re-adopts it."""
    provider = link.provider
    if link.user.is_active:
        deactivate(link)
    link.groups.clear()
    sync_roles(link)
    user = link.user
    audit_record(actor=None, actor_username=actor_name(provider), action="user.deprovisioned",
                 target=user, before={"provider": provider.name, "external_id": link.external_id,
                                      "user_name": link.user_name})
    link.delete()


def sync_roles(link: ScimUser) -> None:
    """Make the user's SSO-granted roles those of the provider's groups they are in
    (none while the account is inactive)."""
    user = link.user
    names = list(link.groups.values_list("display_name", flat=True)) if user.is_active else []
    sso_sync_memberships(user=user, grants=group_role_mapping().grants_for(names),
                         source=SCIM_SOURCE)


# --- groups -----------------------------------------------------------------------------


def _members(provider: ScimProvider, ids: list[str]) -> list[ScimUser]:
    found = {str(m.scim_id): m for m in ScimUser.objects.select_related("user", "provider")
             .filter(provider=provider, scim_id__in=[i for i in ids if _is_uuid(i)])}
    missing = [i for i in ids if i not in found]
    if missing:
        raise _bad(f"members: no user with id {missing[0]!r}.", scim_type="invalidValue")
    return [found[i] for i in ids]


def _is_uuid(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
    except (ValueError, TypeError, AttributeError):
        return False
    return True


def _check_group_name(provider: ScimProvider, name: str, exclude_pk: int | None) -> None:
    if not name.strip():
        raise _bad("displayName is required.")
    if len(name) > 255:
        raise _bad("displayName is longer than 255 characters.")
    qs = ScimGroup.objects.filter(provider=provider, display_name=name)
    if exclude_pk is not None:
        qs = qs.exclude(pk=exclude_pk)
    if qs.exists():
        raise _conflict(f"A group with displayName {name!r} already exists.")


def _audit_group(action: str, group: ScimGroup, **extra: Any) -> None:
    audit_record(actor=None, actor_username=actor_name(group.provider), action=action,
                 target=group, target_repr=f"{group.provider.name}:{group.display_name}",
                 after={"display_name": group.display_name, "external_id": group.external_id,
                        **extra})


@transaction.atomic
def group_create(*, provider: ScimProvider, display_name: str, external_id: str,
                 member_ids: list[str]) -> ScimGroup:
    _check_group_name(provider, display_name, None)
    members = _members(provider, member_ids)
    group = ScimGroup.objects.create(provider=provider, display_name=display_name,
                                     external_id=external_id[:255])
    group.members.set(members)
    _audit_group("scim_group.created", group, members=[m.user_name for m in members])
    for link in members:
        sync_roles(link)
    return group


@transaction.atomic
def group_update(*, group: ScimGroup, display_name: str | None = None,
                 external_id: str | None = None, member_ids: list[str] | None = None,
                 add_ids: list[str] = (), remove_ids: list[str] = ()) -> ScimGroup:  # type: ignore[assignment]
    """Rename, replace members, or add/remove some; re-sync every affected member."""
    provider = group.provider
    before = set(group.members.all())
    renamed = display_name is not None and display_name != group.display_name
    if display_name is not None:
        _check_group_name(provider, display_name, group.pk)
        group.display_name = display_name
    if external_id is not None:
        group.external_id = external_id[:255]
    group.save()
    if member_ids is not None:
        group.members.set(_members(provider, member_ids))
    if add_ids:
        group.members.add(*_members(provider, list(add_ids)))
    if remove_ids:
        group.members.remove(*_members(provider, list(remove_ids)))
    after = set(group.members.all())
    if renamed or before != after:
        _audit_group("scim_group.updated", group,
                     added=sorted(m.user_name for m in after - before),
                     removed=sorted(m.user_name for m in before - after))
    for link in (before | after) if renamed else (before ^ after):
        sync_roles(link)
    return group


@transaction.atomic
def group_delete(*, group: ScimGroup) -> None:
    members = list(group.members.all())
    _audit_group("scim_group.deleted", group, members=[m.user_name for m in members])
    group.delete()
    for link in members:
        sync_roles(link)
