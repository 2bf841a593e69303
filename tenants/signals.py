"""Audit login, logout and failed logins (Django's auth signals)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.dispatch import receiver

from .audit import audit_record
from .models import User


@receiver(user_logged_in)
def _logged_in(sender: Any, request: Any, user: User, **kwargs: Any) -> None:
    audit_record(actor=user, action="auth.login", target=user)


@receiver(user_logged_out)
def _logged_out(sender: Any, request: Any, user: User | None, **kwargs: Any) -> None:
    if user is not None:
        audit_record(actor=user, action="auth.logout", target=user)


@receiver(user_login_failed)
def _login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    # Only the username that was tried: Django already masks the password in
    # ``credentials``, and we never record it anyway.
    username = str(credentials.get("username", ""))[:150]
    audit_record(actor=None, actor_username=username, action="auth.login_failed",
                 target_repr=username)
