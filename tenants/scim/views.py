"""The /scim/v2/ views: django-scim2's, with Camp's lookups and page bound.

Authentication and throttling: ``hooks.ScimBearerAuth`` (django-scim2's AUTH_CHECK_MIDDLEWARE).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.http import HttpRequest, HttpResponse
from django_scim import constants
from django_scim import exceptions as scim_errors
from django_scim import views as scim_views

MAX_PAGE = 200  # ServiceProviderConfig filter.maxResults; a larger count is cut to it


class _Lookup:
    """A malformed id is a 404 (not a database error); pages are at most MAX_PAGE."""

    def get_object(self) -> Any:
        value = self.kwargs.get("uuid", "")  # type: ignore[attr-defined]
        try:
            uuid.UUID(str(value))
        except ValueError as exc:
            raise scim_errors.NotFoundError(value) from exc
        return super().get_object()  # type: ignore[misc]

    def _page(self, request: HttpRequest) -> tuple[int, int]:
        start, count = super()._page(request)  # type: ignore[misc]
        return start, max(0, min(count, MAX_PAGE))


class UsersView(_Lookup, scim_views.UsersView):
    pass


class GroupsView(_Lookup, scim_views.GroupsView):
    pass


class UserSearchView(_Lookup, scim_views.UserSearchView):
    pass


class GroupSearchView(_Lookup, scim_views.GroupSearchView):
    pass


def _listed(response: HttpResponse, missing: str) -> HttpResponse:
    """django-scim2's discovery lists lack totalResults (RFC 7644 §3.4.2 requires it) and
    its 404 has no SCIM error body; add both."""
    if response.status_code == 404:
        body = scim_errors.NotFoundError(missing).to_dict()
        return HttpResponse(json.dumps(body), content_type=constants.SCIM_CONTENT_TYPE,
                            status=404)
    doc = json.loads(response.content)
    if "Resources" in doc:
        doc.update(totalResults=len(doc["Resources"]), itemsPerPage=len(doc["Resources"]),
                   startIndex=1)
        response.content = json.dumps(doc).encode()
    elif "schemas" not in doc and "attributes" in doc:  # one Schema (RFC 7643 §7)
        doc["schemas"] = ["urn:ietf:params:scim:schemas:core:2.0:Schema"]
        response.content = json.dumps(doc).encode()
    return response


class ResourceTypesView(scim_views.ResourceTypesView):
    def get(self, request: HttpRequest, uuid: str | None = None, *args: Any,
            **kwargs: Any) -> HttpResponse:
        return _listed(super().get(request, uuid, *args, **kwargs), uuid or "")


class SchemasView(scim_views.SchemasView):
    def get(self, request: HttpRequest, uuid: str | None = None, *args: Any,
            **kwargs: Any) -> HttpResponse:
        return _listed(super().get(request, uuid, *args, **kwargs), uuid or "")
