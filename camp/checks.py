"""System checks for what a deployment must get right before it starts.

They run with every management command (``migrate`` included, so the migrations Job
stops first), and the ASGI entry point refuses to start on an error among them.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register, run_checks
from django.core.exceptions import ImproperlyConfigured

from tenants.sso.config import LDAP_EXTRA_HINT

CAMP_TAG = "camp"


@register(CAMP_TAG, Tags.compatibility)
def ldap_extra_check(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if getattr(settings, "LDAP_EXTRA_MISSING", False):
        return [Error(LDAP_EXTRA_HINT, hint="Or set LDAP_ENABLED=false.", id="camp.E001")]
    return []


def refuse_to_start() -> None:
    """Raise with every error of Camp's own checks (the ASGI app and workers call this)."""
    errors = [m for m in run_checks(tags=[CAMP_TAG]) if m.is_serious()]
    if errors:
        raise ImproperlyConfigured("; ".join(str(m.msg) for m in errors))
