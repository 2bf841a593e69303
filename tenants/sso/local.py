"""Local accounts: Django's password check, for accounts whose source is local only."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.backends import ModelBackend
from django.http import HttpRequest


class LocalModelBackend(ModelBackend):
    """ModelBackend that never signs in an LDAP or OIDC account by a local password.

    SSO accounts get an unusable password; this also covers one that was given a
    password later, so the identity source stays the only way in.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> Any:
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and getattr(user, "auth_source", "local") != "local":
            return None
        return user
