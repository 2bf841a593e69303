"""DRF authentication by API token: ``Authorization: Bearer camp_…``."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from .services import token_authenticate


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0] not in (self.keyword, "Token"):
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(_("Malformed Authorization header."))
        token = token_authenticate(parts[1])
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid, expired or revoked token."))
        user = token.user
        # permissions.scope_of reads this to narrow the user to the token's project/read-only.
        user.camp_token = token  # type: ignore[attr-defined]
        return user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
