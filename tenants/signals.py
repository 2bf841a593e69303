"""Audit login, logout and failed logins (Django's auth signals)."""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out
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
    if getattr(request, "axes_locked_out", False):
        # Refused by the lockout itself: one auth.locked_out event records the lockout,
        # so a flood of attempts cannot flood the audit log.
        return
    if getattr(request, "camp_directory_unavailable", False):
        # Not a failure: the directory did not answer (audited as auth.login_refused).
        return
    username = str(credentials.get("username", ""))[:150]
    audit_record(actor=None, actor_username=username, action="auth.login_failed",
                 target_repr=username)


@receiver(user_locked_out)
def _locked_out(sender: Any, request: Any = None, username: str | None = None,
                ip_address: str | None = None, **kwargs: Any) -> None:
    # django-axes signals this on every refused attempt; record each lockout once: a pair
    # once per (username, address), an address once whatever names are tried from it
    # (CampAxesHandler says which one tripped).
    from django.conf import settings
    from django.core.cache import cache

    scope = getattr(request, "camp_lockout_scope", "") or "account+address"
    name = "" if scope == "address" else str(username or "")[:150]
    key = f"camp:audit-lockout:{scope}:{name}:{ip_address}"
    if not cache.add(key, 1, timeout=int(float(settings.AXES_COOLOFF_TIME) * 3600) or 900):
        return
    audit_record(actor=None, actor_username=name, action="auth.locked_out",
                 target_repr=name or str(ip_address or ""),
                 after={"ip_address": ip_address, "scope": scope})
