"""SAML endpoints. /saml/metadata/ is Camp's SP metadata and, by default, its entity id.

The views are imported at their first request: pysaml2 and its XML schemas take about a
second to import, which every Camp process (web, worker, management commands) would pay
even with SAML switched off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.views.decorators.csrf import csrf_exempt


def _lazy(name: str, *, cross_site_post: bool = False) -> Callable[..., HttpResponse]:
    def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not getattr(settings, "SAML_ENABLED", False):
            raise Http404("SAML is not enabled.")
        from . import saml  # the system check camp.E101 names a missing package

        response: HttpResponse = getattr(saml, name).as_view()(request, *args, **kwargs)
        return response

    # The IdP posts cross-site: see SAMLACSView for what protects these instead of CSRF.
    return csrf_exempt(view) if cross_site_post else view


urlpatterns: list[URLPattern] = [
    path("login/", _lazy("SAMLLoginView"), name="saml2_login"),
    path("acs/", _lazy("SAMLACSView", cross_site_post=True), name="saml2_acs"),
    path("ls/", _lazy("SAMLLogoutServiceView", cross_site_post=True), name="saml2_ls"),
    path("ls/post/", _lazy("SAMLLogoutServiceView", cross_site_post=True), name="saml2_ls_post"),
    path("metadata/", _lazy("SAMLMetadataView"), name="saml2_metadata"),
]
