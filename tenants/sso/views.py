"""Login page, logout (ending the provider session too) and the OIDC endpoints."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import resolve_url
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from tenants.forms import LoginForm

from .discovery import ProviderError, endpoints, forget_provider_metadata
from .oidc import GENERIC_MESSAGE, STATE_MESSAGE, UNREACHABLE_MESSAGE, provider_logout_url
from .services import sso_login_refused

logger = logging.getLogger(__name__)


def password_login_enabled() -> bool:
    """The username/password form is shown when local accounts or LDAP are on."""
    return bool(settings.LOCAL_LOGIN_ENABLED or settings.LDAP_ENABLED)


class SSOLoginForm(LoginForm):
    def clean(self) -> dict[str, Any]:
        if not password_login_enabled():
            raise ValidationError("Password login is switched off; use single sign-on.")
        try:
            return super().clean()
        except ValidationError:
            message = getattr(self.request, "camp_login_error", None)
            if message:
                raise ValidationError(message, code="sso_refused") from None
            raise


class LoginView(auth_views.LoginView):
    authentication_form = SSOLoginForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context.update(
            password_login=password_login_enabled(),
            local_login=settings.LOCAL_LOGIN_ENABLED,
            ldap_login=settings.LDAP_ENABLED,
            oidc_login=settings.OIDC_ENABLED,
            oidc_provider_name=settings.OIDC_PROVIDER_NAME,
            # Without the package the SAML URLs are absent (the system check says why).
            saml_login=getattr(settings, "SAML_ENABLED", False)
            and importlib.util.find_spec("djangosaml2") is not None,
            saml_provider_name=getattr(settings, "SAML_PROVIDER_NAME", "SAML single sign-on"),
        )
        return context


class LogoutView(auth_views.LogoutView):
    """End the Camp session and, for an SSO account, the provider's session too.

    OIDC: RP-initiated logout at the provider's end_session_endpoint, which sends the
    browser back to Camp's login page. SAML: a LogoutRequest to the IdP (single logout),
    whose LogoutResponse comes back to /saml/ls/.
    """

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        source = getattr(user, "auth_source", "") if user.is_authenticated else ""
        if source == "saml" and getattr(settings, "SAML_ENABLED", False):
            from .saml import SAMLLogoutInitView

            return SAMLLogoutInitView.as_view()(request)
        provider_url = None
        if source == "oidc":
            provider_url = provider_logout_url(
                request, request.build_absolute_uri(resolve_url(settings.LOGOUT_REDIRECT_URL)))
        response: HttpResponse = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(provider_url) if provider_url else response


class _OIDCEnabledMixin:
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.OIDC_ENABLED:
            raise Http404("OpenID Connect is not enabled.")
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


def _back_to_login(request: HttpRequest, message: str) -> HttpResponse:
    messages.error(request, message)
    return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))


class OIDCAuthenticateView(_OIDCEnabledMixin, OIDCAuthenticationRequestView):  # type: ignore[misc]
    """Redirect to the provider with state, nonce and a PKCE S256 challenge (the library)."""

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            self.OIDC_OP_AUTH_ENDPOINT = endpoints().authorization_endpoint
        except ProviderError as exc:
            logger.warning("OIDC discovery failed: %s", exc.reason)
            sso_login_refused(request=request, source="oidc", username="",
                              reason=f"provider unreachable: {exc.reason}",
                              message=UNREACHABLE_MESSAGE)
            return _back_to_login(request, UNREACHABLE_MESSAGE)
        return super().get(request)  # type: ignore[no-any-return]


class OIDCCallbackView(_OIDCEnabledMixin, OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """Finish the code flow; every failure is audited and explained on the login page."""

    def _refuse(self, reason: str, message: str) -> HttpResponse:
        sso_login_refused(request=self.request, source="oidc", username="", reason=reason,
                          message=message)
        return self.login_failure()

    def get(self, request: HttpRequest) -> HttpResponse:
        error = request.GET.get("error")
        if error:
            # The provider's own error code only (e.g. access_denied), never the raw query.
            sso_login_refused(request=request, source="oidc", username="",
                              reason=f"provider error: {error[:64]}", message=GENERIC_MESSAGE)
        elif not (request.GET.get("code") and request.GET.get("state")):
            return self._refuse("callback without code or state", STATE_MESSAGE)
        elif request.GET["state"] not in request.session.get("oidc_states", {}):
            # A forged, replayed or stale callback (the library would answer a bare redirect).
            return self._refuse("callback state unknown to this session", STATE_MESSAGE)
        try:
            return super().get(request)  # type: ignore[no-any-return]
        except ProviderError as exc:
            logger.warning("OIDC provider request failed: %s", exc.reason)
            forget_provider_metadata()  # it may be stale: rediscover at the next attempt
            return self._refuse(f"provider unreachable: {exc.reason}", UNREACHABLE_MESSAGE)
        except SuspiciousOperation as exc:
            # TokenRefused carries its reason and message; the library's own
            # SuspiciousOperation (nonce, state) only a short text.
            reason = getattr(exc, "reason", None) or f"invalid callback: {str(exc)[:120]}"
            return self._refuse(reason, getattr(exc, "message", GENERIC_MESSAGE))
        except requests.RequestException as exc:
            # The exception text may quote the provider's answer; log its type only.
            logger.warning("OIDC provider request failed: %s", type(exc).__name__)
            return self._refuse("provider unreachable or refused the code", UNREACHABLE_MESSAGE)

    def login_success(self) -> HttpResponse:
        response: HttpResponse = super().login_success()
        claims = getattr(self.request, "camp_oidc_claims", None)
        if claims is not None:
            from .backchannel import record_login

            record_login(self.request, self.user, claims)
        return response

    def login_failure(self) -> HttpResponse:
        message = getattr(self.request, "camp_login_error", None)
        user = getattr(self, "user", None)
        if user is not None and not user.is_active:
            message = "This account is deactivated."
            sso_login_refused(request=self.request, source="oidc", username=user.username,
                              reason="account deactivated", message=message)
        elif message is None:
            # No refusal was recorded on the way (e.g. the backend returned no user).
            message = GENERIC_MESSAGE
            sso_login_refused(request=self.request, source="oidc", username="",
                              reason="no account signed in", message=message)
        return _back_to_login(self.request, message)


@csrf_exempt
@require_POST
def backchannel_logout(request: HttpRequest) -> HttpResponse:
    """OpenID Connect Back-Channel Logout 1.0 §2.5–2.8: the provider POSTs ``logout_token``.

    Not a browser request (no cookie, no CSRF token): the signed token is the credential.
    200 when the token is valid (whether or not a session matched), 400 otherwise, never
    cached."""
    from django.db import transaction

    from .backchannel import (
        LogoutTokenRefused,
        audit_logout,
        audit_refusal,
        end_sessions,
        verify_logout_token,
    )

    if not settings.OIDC_ENABLED:
        raise Http404("OpenID Connect is not enabled.")
    token = request.POST.get("logout_token", "")
    response: HttpResponse
    try:
        if not token:
            raise LogoutTokenRefused("no logout_token")
        claims = verify_logout_token(token)
    except LogoutTokenRefused as exc:
        audit_refusal(exc.reason)
        response = JsonResponse({"error": "invalid_request", "error_description": exc.reason},
                                status=400)
    else:
        with transaction.atomic():
            ended, _count = end_sessions(claims)
            audit_logout(claims, ended)
        response = HttpResponse(status=200)
    response["Cache-Control"] = "no-store"
    return response
