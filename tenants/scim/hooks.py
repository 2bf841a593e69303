"""django-scim2 hooks that its adapters import while loading (so kept out of adapters.py):
the filter parsers (SCIM filter → SQL over Camp's SCIM tables), the model getter, where
resources live, and the per-provider scoping of every query."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django_scim import constants
from django_scim.filters import GroupFilterQuery, UserFilterQuery
from django_scim.middleware import SCIMAuthCheckMiddleware
from rest_framework.throttling import SimpleRateThrottle

from tenants.middleware import client_ip

from .models import ScimGroup, ScimUser
from .services import scim_token_authenticate


def _raw_search(query: Any, model: Any, filter_query: str, request: Any) -> Any:
    """The rows a SCIM filter selects (the library's SQL over ``model``'s table); none for a
    filter that names nothing Camp keeps."""
    q = query.query_class(filter_query, query.table_name(), query.attr_map, query.joins)
    if q.where_sql is None:
        return model.objects.none()
    sql, params = query.get_raw_args(q, request)
    return model.objects.raw(sql, params)


class CampUserFilter(UserFilterQuery):
    model_getter = ScimUser  # type: ignore[assignment]
    attr_map = {
        ("userName", None, None): "user_name",  # case-insensitive (the library's UPPER())
        ("externalId", None, None): "external_id",
        ("id", None, None): "scim_id",
    }

    @classmethod
    def table_name(cls) -> str:
        return ScimUser._meta.db_table

    @classmethod
    def search(cls, filter_query: str, request: Any = None) -> Any:
        return _raw_search(cls, ScimUser, filter_query, request).prefetch_related("user")


class CampGroupFilter(GroupFilterQuery):
    model_getter = ScimGroup  # type: ignore[assignment]
    attr_map = {
        ("displayName", None, None): "display_name",
        ("externalId", None, None): "external_id",
        ("id", None, None): "scim_id",
    }

    @classmethod
    def table_name(cls) -> str:
        return ScimGroup._meta.db_table

    @classmethod
    def search(cls, filter_query: str, request: Any = None) -> Any:
        return _raw_search(cls, ScimGroup, filter_query, request)


def user_model() -> type[ScimUser]:
    return ScimUser


def base_location(request: HttpRequest | None = None, *args: Any, **kwargs: Any) -> str:
    if request is None:
        return ""
    return f"{request.scheme}://{request.get_host()}"


def provider_filter(model: Any) -> Any:
    """Every lookup, list and search sees the calling provider's resources only."""
    def kwargs(request: HttpRequest, *args: Any, **kw: Any) -> dict[str, Any]:
        return {"provider_id": request.scim_provider.pk}  # type: ignore[attr-defined]
    return kwargs


class _Throttle(SimpleRateThrottle):
    """DRF's rate limiter (the cache, so Redis in production) keyed by SCIM token or address."""

    def __init__(self, key: str, rate: str) -> None:
        self.key = key
        self.rate = rate
        self.num_requests, self.duration = self.parse_rate(rate)

    def get_cache_key(self, request: Any, view: Any) -> str:
        return f"throttle_scim_{self.key}"


def _error(status: int, detail: str, **headers: str) -> HttpResponse:
    body = {"schemas": [constants.SchemaURI.ERROR], "status": str(status), "detail": detail}
    response = HttpResponse(json.dumps(body), content_type=constants.SCIM_CONTENT_TYPE,
                            status=status)
    for name, value in headers.items():
        response[name] = value
    return response


class ScimBearerAuth(SCIMAuthCheckMiddleware):
    """``Authorization: Bearer campscim_…`` and nothing else.

    A browser session or an API token (``camp_…``) is not a SCIM credential: both get 401.
    Requests are throttled per token (``SCIM_THROTTLE_RATE``); failed authentication
    per client address (``SCIM_AUTH_FAILURE_RATE``)."""

    def process_request(self, request: HttpRequest) -> HttpResponse | None:
        if not request.path.startswith(self.reverse_url):
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, credential = header.partition(" ")
        token = (scim_token_authenticate(credential.strip())
                 if scheme.lower() == "bearer" else None)
        if token is None:
            throttle = _Throttle(f"fail_{client_ip(request)}", settings.SCIM_AUTH_FAILURE_RATE)
            if not throttle.allow_request(request, None):  # type: ignore[arg-type]
                return _error(429, "Too many failed SCIM authentications.",
                              **{"Retry-After": str(int(throttle.wait() or 1))})
            return _error(401, "A SCIM bearer token is required (manage.py scim_token).",
                          **{"WWW-Authenticate": 'Bearer realm="camp-scim"'})
        throttle = _Throttle(f"token_{token.pk}", settings.SCIM_THROTTLE_RATE)
        if not throttle.allow_request(request, None):  # type: ignore[arg-type]
            return _error(429, "Too many SCIM requests; slow down.",
                          **{"Retry-After": str(int(throttle.wait() or 1))})
        request.scim_token = token  # type: ignore[attr-defined]
        request.scim_provider = token.provider  # type: ignore[attr-defined]
        return None


def schemas() -> list[dict[str, Any]]:
    """django-scim2's schemas, with the Group's displayName required (Camp needs it: it
    is the group name SSO_GROUP_ROLES maps; RFC 7643 leaves it optional) and the members'
    ``display`` that Camp returns described."""
    import copy

    from django_scim.schemas import ALL

    published = copy.deepcopy(ALL)
    for schema in published:
        if schema.get("id") == "urn:ietf:params:scim:schemas:core:2.0:Group":
            for attribute in schema.get("attributes", []):
                if attribute.get("name") == "displayName":
                    attribute["required"] = True
                if attribute.get("name") == "members":  # as Okta, Entra and Camp send it
                    attribute["subAttributes"].append({
                        "name": "display", "type": "string", "multiValued": False,
                        "description": "The member's userName.", "required": False,
                        "caseExact": False, "mutability": "readOnly", "returned": "default",
                        "uniqueness": "none"})
    return published
