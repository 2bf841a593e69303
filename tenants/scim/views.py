"""The /scim/v2/ views: django-scim2's, with Camp's lookups and page bound.

Authentication and throttling: ``hooks.ScimBearerAuth`` (django-scim2's AUTH_CHECK_MIDDLEWARE).
"""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest
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
