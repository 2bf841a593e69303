"""Local accounts: Django's password check, for accounts whose source is local only."""

from __future__ import annotations

from typing import Any

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_failure_limit, get_lockout_parameters
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.db.models import Sum
from django.http import HttpRequest


class LocalModelBackend(ModelBackend):
    """ModelBackend that never signs in an LDAP or OIDC account by a local password.

    SSO accounts get an unusable password; this also covers one that was given a
    password later, so the identity source stays the only way in.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> Any:
        from tenants.models import User

        if username and not User.objects.filter(username=username).exists():
            # The login form hands over the canonical (case-folded) name; a local account
            # from before usernames were normalised may differ from it in case only.
            legacy = User.objects.filter(username__iexact=username, auth_source="local"
                                         ).order_by("pk").first()
            if legacy is not None:
                username = legacy.username
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is not None and getattr(user, "auth_source", "local") != "local":
            return None
        return user


def lockout_parameters(request_or_attempt: Any, credentials: dict[str, Any] | None = None
                       ) -> list[str | list[str]]:
    """django-axes AXES_LOCKOUT_PARAMETERS: per (username, address) and per address.

    Never per username alone: then anyone anywhere could lock a victim out by failing
    with the victim's name (a denial of service); a guesser is held by the pair, and a
    guesser spraying many names from one address by the address (CampAxesHandler).
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
    return [["username", "ip_address"], ["ip_address"]] if username else [["ip_address"]]


class CampAxesHandler(AxesDatabaseHandler):
    """axes' database handler with a separate, higher limit for an address on its own.

    axes applies one AXES_FAILURE_LIMIT to every lockout parameter set, which would make
    the (username, address) pair pointless (its count never exceeds the address's) and
    lock a whole office behind one NAT after a few typos. So the address's count is
    scaled onto that limit: it locks at LOGIN_FAILURE_LIMIT_PER_IP failures. Which set
    tripped is left on the request for the audit (tenants/signals.py).

    The address's own limit does not apply to the break-glass account (an active local
    platform admin: the way in when single sign-on or a NAT'd office is locked) nor to a
    request from an already signed-in user; their (username, address) pair still locks.
    A success clears only the signed-in account's own failures from that address
    (axes' reset-on-success would delete every row of the address, the attacked
    accounts' and the address's count included).
    """

    def user_login_failed(self, sender: Any, credentials: dict[str, Any], request: Any = None,
                          **kwargs: Any) -> None:
        # The directory did not answer: the password was never judged, so nothing is
        # counted (a directory outage must lock nobody out; tenants/sso/ldap.py).
        if getattr(request, "camp_directory_unavailable", False):
            return
        super().user_login_failed(sender, credentials, request, **kwargs)

    def reset_user_attempts(self, request: Any, credentials: dict[str, Any] | None = None) -> int:
        from axes.helpers import get_client_username
        from axes.models import AccessAttempt

        username = get_client_username(request, credentials)
        if not username:
            return 0
        deleted, _ = AccessAttempt.objects.filter(
            username=username, ip_address=request.axes_ip_address).delete()
        return int(deleted)

    def get_failures(self, request: Any, credentials: dict[str, Any] | None = None) -> int:
        limit = get_failure_limit(request, credentials)
        per_ip = max(int(settings.LOGIN_FAILURE_LIMIT_PER_IP), limit)
        worst, scope = 0, ""
        exempt = _exempt_from_address_limit(request, credentials)
        for params, attempts in zip(get_lockout_parameters(request, credentials),
                                    self.get_user_attempts(request, credentials), strict=True):
            address_only = params in (["ip_address"], "ip_address")
            if address_only and exempt:
                continue
            count = attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
            if address_only:
                count = count * limit // per_ip
            if count > worst or (count == worst and not scope):
                worst, scope = count, "address" if address_only else "account+address"
        if worst >= limit and request is not None:
            request.camp_lockout_scope = scope
        return worst


def _exempt_from_address_limit(request: Any, credentials: dict[str, Any] | None) -> bool:
    """Whether a login attempt skips the per-address limit (CampAxesHandler)."""
    from axes.helpers import get_client_username

    from tenants.models import User

    signed_in = getattr(request, "user", None)
    if signed_in is not None and signed_in.is_authenticated:
        return True
    username = get_client_username(request, credentials) if request is not None else None
    if not username:
        return False
    user = User.objects.filter(username=username, auth_source="local").first()
    return bool(user is not None and user.platform_admin)
