"""django-scim2 adapters: SCIM JSON ⇄ Camp, as Okta, Entra ID and OneLogin send it.

django-scim2 does the protocol (routing, ListResponse, filter parsing into SQL, errors);
these adapters turn a resource into the calls of ``tenants.scim.services``. PATCH is
handled here in full (the library's own handlers cover only a few paths): with or
without ``path``, ``op`` in any case (Entra sends ``Replace``), booleans as JSON or as
the strings ``"True"``/``"False"`` (Entra), ``emails[type eq "work"].value``, group
``members`` add/remove/replace and ``members[value eq "…"]`` removal (Okta).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urljoin

from django.core.exceptions import ValidationError
from django.core.validators import EmailValidator
from django.http import HttpRequest
from django_scim import constants
from django_scim import exceptions as scim_errors
from django_scim.adapters import SCIMGroup, SCIMUser
from django_scim.models import SCIMServiceProviderConfig

from . import services
from .models import ScimGroup, ScimUser
from .services import UserFields
from .views import MAX_PAGE

CORE_USER = constants.SchemaURI.USER
CORE_GROUP = constants.SchemaURI.GROUP
ENTERPRISE = constants.SchemaURI.ENTERPRISE_USER

# Core User attributes (RFC 7643 §4.1) Camp accepts but does not keep, and the
# enterprise extension: Entra's default mapping sends title, addresses, phone numbers,
# department, manager… Refusing them would stop provisioning; anything else is a 400.
IGNORED_USER_ATTRIBUTES = frozenset({
    "displayname", "nickname", "profileurl", "title", "usertype", "preferredlanguage",
    "locale", "timezone", "password", "phonenumbers", "ims", "photos", "addresses",
    "entitlements", "roles", "x509certificates", "groups", "schemas", "id", "meta",
})

_EMAIL_VALUE = re.compile(r'^emails(\[[^\]]*\])?\.value$', re.IGNORECASE)
_MEMBER_FILTER = re.compile(r'^members\[\s*value\s+eq\s+"([^"]*)"\s*\]$', re.IGNORECASE)


def _strip_schema(path: str, schema: str) -> str:
    prefix = schema + ":"
    return path[len(prefix):] if path.lower().startswith(prefix.lower()) else path


def as_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise scim_errors.BadRequestError(f"{field} must be true or false.", scim_type="invalidValue")


def as_str(value: Any, field: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise scim_errors.BadRequestError(f"{field} must be a string.", scim_type="invalidValue")
    return value.strip()


def _email(value: Any) -> str:
    """The primary (else the first) address of ``emails``; OneLogin sends one object."""
    if value in (None, "", []):
        return ""
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise scim_errors.BadRequestError("emails must be a list of objects.",
                                          scim_type="invalidValue")
    chosen = next((v for v in value if v.get("primary") in (True, "true", "True")), value[0])
    return _checked_email(chosen.get("value"))


def _checked_email(value: Any) -> str:
    address = as_str(value, "emails")
    if address:
        try:
            EmailValidator()(address)
        except ValidationError as exc:
            raise scim_errors.BadRequestError(f"emails: {address!r} is not an e-mail address.",
                                              scim_type="invalidValue") from exc
    return address


ALWAYS_RETURNED = frozenset({"id", "schemas", "meta"})


def project(d: dict[str, Any], request: HttpRequest | None) -> dict[str, Any]:
    """``attributes`` / ``excludedAttributes`` (RFC 7644 §3.9) on top-level attributes;
    Entra asks for groups with ``excludedAttributes=members``."""
    if request is None:
        return d

    def names(param: str) -> set[str]:
        raw = request.GET.get(param, "") if request is not None else ""
        return {_strip_schema(_strip_schema(n.strip(), CORE_USER), CORE_GROUP)
                .split(".")[0].lower() for n in raw.split(",") if n.strip()}

    wanted, excluded = names("attributes"), names("excludedAttributes")
    return {k: v for k, v in d.items()
            if k in ALWAYS_RETURNED or ((not wanted or k.lower() in wanted)
                                         and k.lower() not in excluded)}


def _request_provider(request: HttpRequest) -> Any:
    return request.scim_provider  # type: ignore[attr-defined]


class CampScimUser(SCIMUser):
    id_field = "scim_id"
    obj: ScimUser

    def __init__(self, obj: ScimUser, request: HttpRequest | None = None) -> None:
        super().__init__(obj, request=request)
        self._fields: UserFields | None = None

    @classmethod
    def resource_type_dict(cls, request: HttpRequest | None = None) -> dict[str, Any]:
        # RFC 7643 §6: the endpoint is relative to the base URL (/scim/v2), not the host.
        return {**super().resource_type_dict(request), "endpoint": "/Users"}

    # -- reading ----------------------------------------------------------------------
    def current_fields(self) -> UserFields:
        user = self.obj.user
        return UserFields(user_name=self.obj.user_name, external_id=self.obj.external_id,
                          email=user.email, first_name=user.first_name,
                          last_name=user.last_name, active=user.is_active)

    @property
    def display_name(self) -> str:
        user = self.obj.user
        full = f"{user.first_name} {user.last_name}".strip()
        return full or self.obj.user_name

    @property
    def emails(self) -> list[dict[str, Any]]:
        email = self.obj.user.email
        return [{"value": email, "primary": True, "type": "work"}] if email else []

    @property
    def groups(self) -> list[dict[str, Any]]:
        return [{"value": str(g.scim_id), "display": g.display_name,
                 "$ref": CampScimGroup(g, self.request).location}
                for g in self.obj.groups.all()]

    @property
    def meta(self) -> dict[str, Any]:
        return {"resourceType": self.resource_type, "created": self.obj.created_at.isoformat(),
                "lastModified": self.obj.updated_at.isoformat(), "location": self.location}

    def to_dict(self) -> dict[str, Any]:
        user = self.obj.user
        d: dict[str, Any] = {
            "schemas": [CORE_USER],
            "id": self.id,
            "userName": self.obj.user_name,
            "name": {"givenName": user.first_name, "familyName": user.last_name,
                     "formatted": self.display_name},
            "displayName": self.display_name,
            "emails": self.emails,
            "active": user.is_active,
            "groups": self.groups,
            "meta": self.meta,
        }
        if self.obj.external_id:
            d["externalId"] = self.obj.external_id
        return project(d, self._request)

    # -- writing ----------------------------------------------------------------------
    def validate_dict(self, d: dict[str, Any]) -> None:
        if not isinstance(d, dict):
            raise scim_errors.BadRequestError("The body must be a JSON object.")

    def from_dict(self, d: dict[str, Any]) -> None:
        """POST and PUT: the whole resource. ``active`` absent keeps the current state."""
        name = d.get("name") or {}
        if not isinstance(name, dict):
            raise scim_errors.BadRequestError("name must be an object.", scim_type="invalidValue")
        active = d.get("active")
        self._fields = UserFields(
            user_name=as_str(d.get("userName"), "userName"),
            external_id=as_str(d.get("externalId"), "externalId"),
            email=_email(d.get("emails")),
            first_name=as_str(name.get("givenName"), "name.givenName"),
            last_name=as_str(name.get("familyName"), "name.familyName"),
            active=(as_bool(active, "active") if active is not None
                    else (self.obj.user.is_active if self.obj.pk else True)),
        )

    def save(self) -> None:
        assert self._fields is not None
        provider = _request_provider(self.request)
        if self.obj.pk is None:
            self.obj = services.provision_user(provider=provider, fields=self._fields)
        else:
            self.obj = services.update_user(link=self.obj, fields=self._fields)

    def delete(self) -> None:
        services.deprovision(self.obj)

    def handle_operations(self, operations: list[Any]) -> None:
        fields = self.current_fields()
        for operation in operations:
            op, path, value = _operation(operation)
            if path:
                self._apply(fields, op, path, value)
            elif isinstance(value, dict):
                for key, item in value.items():
                    self._apply(fields, op, key, item)
            else:
                raise scim_errors.BadRequestError(
                    "Operations: an operation without path needs an object value.",
                    scim_type="invalidSyntax")
        self.obj = services.update_user(link=self.obj, fields=fields)

    @staticmethod
    def _apply(fields: UserFields, op: str, path: str, value: Any) -> None:
        if path.lower().startswith(ENTERPRISE.lower()):
            return  # enterprise extension: nothing Camp keeps
        path = _strip_schema(path, CORE_USER)
        key = path.lower()
        removing = op == "remove"
        if key == "active":
            fields.active = False if removing else as_bool(value, "active")
        elif key == "username":
            if removing:
                raise scim_errors.BadRequestError("userName cannot be removed.",
                                                  scim_type="mutability")
            fields.user_name = as_str(value, "userName")
        elif key == "externalid":
            fields.external_id = "" if removing else as_str(value, "externalId")
        elif key == "name":
            if removing:
                fields.first_name = fields.last_name = ""
            elif isinstance(value, dict):
                if "givenName" in value:
                    fields.first_name = as_str(value["givenName"], "name.givenName")
                if "familyName" in value:
                    fields.last_name = as_str(value["familyName"], "name.familyName")
            else:
                raise scim_errors.BadRequestError("name must be an object.",
                                                  scim_type="invalidValue")
        elif key == "name.givenname":
            fields.first_name = "" if removing else as_str(value, "name.givenName")
        elif key == "name.familyname":
            fields.last_name = "" if removing else as_str(value, "name.familyName")
        elif key == "name.formatted":
            return
        elif key == "emails":
            fields.email = "" if removing else _email(value)
        elif _EMAIL_VALUE.match(path):
            fields.email = "" if removing else _checked_email(value)
        elif re.split(r"[.\[]", key, maxsplit=1)[0] in IGNORED_USER_ATTRIBUTES:
            return
        else:
            raise scim_errors.BadRequestError(f"{path}: no such User attribute.",
                                              scim_type="invalidPath")


def _operation(operation: Any) -> tuple[str, str, Any]:
    if not isinstance(operation, dict):
        raise scim_errors.BadRequestError("Operations must be objects.", scim_type="invalidSyntax")
    op = str(operation.get("op", "")).lower()
    if op not in constants.VALID_PATCH_OPS:
        raise scim_errors.BadRequestError(f"op {operation.get('op')!r} is not add, remove or "
                                          "replace.", scim_type="invalidSyntax")
    path = operation.get("path") or ""
    if not isinstance(path, str):
        raise scim_errors.BadRequestError("path must be a string.", scim_type="invalidPath")
    if op == "remove" and not path:
        raise scim_errors.BadRequestError("path is required to remove.", scim_type="noTarget")
    return op, path.strip(), operation.get("value")


def _member_ids(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, dict) and isinstance(v.get("value"), str)
                                              for v in value):
        raise scim_errors.BadRequestError('members must be a list of {"value": "<user id>"}.',
                                          scim_type="invalidValue")
    return [v["value"] for v in value]


class CampScimGroup(SCIMGroup):
    id_field = "scim_id"
    obj: ScimGroup

    def __init__(self, obj: ScimGroup, request: HttpRequest | None = None) -> None:
        super().__init__(obj, request=request)
        self._body: dict[str, Any] | None = None

    @property
    def display_name(self) -> str:
        return self.obj.display_name

    @classmethod
    def resource_type_dict(cls, request: HttpRequest | None = None) -> dict[str, Any]:
        return {**super().resource_type_dict(request), "endpoint": "/Groups"}

    @property
    def members(self) -> list[dict[str, Any]]:
        return [{"value": str(m.scim_id), "display": m.user_name,
                 "$ref": CampScimUser(m, self.request).location}
                for m in self.obj.members.all()]

    @property
    def meta(self) -> dict[str, Any]:
        return {"resourceType": self.resource_type, "created": self.obj.created_at.isoformat(),
                "lastModified": self.obj.updated_at.isoformat(), "location": self.location}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schemas": [CORE_GROUP], "id": self.id,
                             "displayName": self.obj.display_name, "members": self.members,
                             "meta": self.meta}
        if self.obj.external_id:
            d["externalId"] = self.obj.external_id
        return project(d, self._request)

    def validate_dict(self, d: dict[str, Any]) -> None:
        if not isinstance(d, dict):
            raise scim_errors.BadRequestError("The body must be a JSON object.")

    def from_dict(self, d: dict[str, Any]) -> None:
        self._body = {"display_name": as_str(d.get("displayName"), "displayName"),
                      "external_id": as_str(d.get("externalId"), "externalId"),
                      "member_ids": _member_ids(d.get("members"))}

    def save(self) -> None:
        assert self._body is not None
        if self.obj.pk is None:
            self.obj = services.group_create(provider=_request_provider(self.request),
                                             **self._body)
        else:
            self.obj = services.group_update(group=self.obj, **self._body)

    def delete(self) -> None:
        services.group_delete(group=self.obj)

    def handle_operations(self, operations: list[Any]) -> None:
        for operation in operations:
            op, path, value = _operation(operation)
            items = [(path, value)] if path else (
                list(value.items()) if isinstance(value, dict) else None)
            if items is None:
                raise scim_errors.BadRequestError(
                    "Operations: an operation without path needs an object value.",
                    scim_type="invalidSyntax")
            for item_path, item in items:
                self._apply(op, _strip_schema(item_path, CORE_GROUP), item)

    def _apply(self, op: str, path: str, value: Any) -> None:
        key = path.lower()
        member = _MEMBER_FILTER.match(path)
        if key == "displayname":
            if op == "remove":
                raise scim_errors.BadRequestError("displayName cannot be removed.",
                                                  scim_type="mutability")
            self.obj = services.group_update(group=self.obj,
                                             display_name=as_str(value, "displayName"))
        elif key == "externalid":
            self.obj = services.group_update(
                group=self.obj, external_id="" if op == "remove" else as_str(value, "externalId"))
        elif key == "members":
            ids = _member_ids(value)
            if op == "add":
                self.obj = services.group_update(group=self.obj, add_ids=ids)
            elif op == "replace":
                self.obj = services.group_update(group=self.obj, member_ids=ids)
            elif value is None:  # remove without a value: every member
                self.obj = services.group_update(group=self.obj, member_ids=[])
            else:
                self.obj = services.group_update(group=self.obj, remove_ids=ids)
        elif member and op == "remove":
            self.obj = services.group_update(group=self.obj, remove_ids=[member.group(1)])
        elif key in ("id", "schemas", "meta"):
            return  # Okta repeats the id in a replace; it cannot change
        else:
            raise scim_errors.BadRequestError(f"{path}: no such Group attribute (or operation).",
                                              scim_type="invalidPath")


class CampServiceProviderConfig(SCIMServiceProviderConfig):
    def to_dict(self) -> dict[str, Any]:
        return {
            "schemas": [constants.SchemaURI.SERVICE_PROVIDER_CONFIG],
            "documentationUri": urljoin(self.location, "/api/docs/"),
            "patch": {"supported": True},
            "bulk": {"supported": False, "maxOperations": 0, "maxPayloadSize": 0},
            "filter": {"supported": True, "maxResults": MAX_PAGE},
            "changePassword": {"supported": False},
            "sort": {"supported": False},
            "etag": {"supported": False},
            "authenticationSchemes": [{
                "type": "oauthbearertoken", "name": "Bearer token", "primary": True,
                "description": "A SCIM token a platform admin creates for one identity provider "
                               "(manage.py scim_token).",
            }],
            "meta": self.meta,
        }
