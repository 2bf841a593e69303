"""SAML endpoints. /saml/metadata/ is Camp's SP metadata and, by default, its entity id."""

from django.urls import URLPattern, path

urlpatterns: list[URLPattern] = []
try:
    from .saml import (
        SAMLACSView,
        SAMLLoginView,
        SAMLLogoutServiceView,
        SAMLMetadataView,
    )
except ImportError:  # pysaml2/djangosaml2 missing: the system check camp.E101 says so
    pass
else:
    urlpatterns = [
        path("login/", SAMLLoginView.as_view(), name="saml2_login"),
        path("acs/", SAMLACSView.as_view(), name="saml2_acs"),
        path("ls/", SAMLLogoutServiceView.as_view(), name="saml2_ls"),
        path("ls/post/", SAMLLogoutServiceView.as_view(), name="saml2_ls_post"),
        path("metadata/", SAMLMetadataView.as_view(), name="saml2_metadata"),
    ]
