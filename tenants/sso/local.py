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


def lockout_parameters(request_or_attempt: Any, credentials: dict[str, Any] | None = None
                       ) -> list[str | list[str]]:
    """django-axes AXES_LOCKOUT_PARAMETERS: per username and per address, or per address only.

    A failed OIDC or SAML sign-in has no username; axes would file it under username
    "None" and, once any few such failures happened anywhere, lock single sign-on for
    everyone. Those count per client address only.
    """
    from axes.helpers import get_client_username
    from axes.models import AccessBase

    if isinstance(request_or_attempt, AccessBase):
        username = request_or_attempt.username
    else:
        username = get_client_username(request_or_attempt, credentials)
    return [["username"], ["ip_address"]] if username else [["ip_address"]]
