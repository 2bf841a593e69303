"""Login page and OIDC endpoints that follow the enabled integrations."""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from tenants.forms import LoginForm

from .oidc import GENERIC_MESSAGE
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
        )
        return context


class _OIDCEnabledMixin:
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not settings.OIDC_ENABLED:
            raise Http404("OpenID Connect is not enabled.")
        return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]


class OIDCAuthenticateView(_OIDCEnabledMixin, OIDCAuthenticationRequestView):  # type: ignore[misc]
    """Redirect to the provider with state, nonce and a PKCE S256 challenge (the library)."""


class OIDCCallbackView(_OIDCEnabledMixin, OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """Finish the code flow; every failure is audited and explained on the login page."""

    def get(self, request: HttpRequest) -> HttpResponse:
        error = request.GET.get("error")
        if error:
            # The provider's own error code only (e.g. access_denied), never the raw query.
            sso_login_refused(request=request, source="oidc", username="",
                              reason=f"provider error: {error[:64]}", message=GENERIC_MESSAGE)
        try:
            return super().get(request)  # type: ignore[no-any-return]
        except SuspiciousOperation as exc:
            sso_login_refused(request=request, source="oidc", username="",
                              reason=f"invalid callback: {str(exc)[:120]}", message=GENERIC_MESSAGE)
        except requests.RequestException as exc:
            # The exception text may quote the provider's answer; log its type only.
            logger.warning("OIDC provider request failed: %s", type(exc).__name__)
            sso_login_refused(request=request, source="oidc", username="",
                              reason="provider unreachable or refused the code",
                              message=GENERIC_MESSAGE)
        return self.login_failure()

    def login_failure(self) -> HttpResponse:
        message = getattr(self.request, "camp_login_error", None) or GENERIC_MESSAGE
        user = getattr(self, "user", None)
        if user is not None and not user.is_active:
            message = "This account is deactivated."
        messages.error(self.request, message)
        return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))
