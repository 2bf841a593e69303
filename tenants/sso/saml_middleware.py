"""djangosaml2's SAML session cookie, switched on with SAML_ENABLED (no pysaml2 import)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse


class SAMLSessionMiddleware:
    """djangosaml2's separate SAML session cookie, only when SAML is on.

    The IdP posts the assertion cross-site, and Camp's session cookie (SameSite=Lax) is not
    sent with such a POST; djangosaml2 keeps the pending request ids in a second cookie
    that is SameSite=None. Browsers drop SameSite=None cookies that are not Secure, so over
    plain HTTP (development, tests) it falls back to Lax.
    """

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self._inner: Any = None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not getattr(settings, "SAML_ENABLED", False):
            return self.get_response(request)  # type: ignore[no-any-return]
        if self._inner is None:
            from djangosaml2.middleware import SamlSessionMiddleware

            self._inner = SamlSessionMiddleware(self.get_response)
        response: HttpResponse = self._inner(request)
        name = getattr(settings, "SAML_SESSION_COOKIE_NAME", "saml_session")
        if name in response.cookies and not settings.SESSION_COOKIE_SECURE:
            response.cookies[name]["samesite"] = "Lax"
        return response
