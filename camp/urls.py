from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.templatetags.static import static
from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerSplitView

from camp.schema import CachedSchemaView
from portal import views as portal_views
from tenants.sso.views import LoginView, LogoutView


def favicon(request: HttpRequest) -> HttpResponsePermanentRedirect:
    # Resolved per request, not when the URLconf loads: with the manifest storage of
    # production a name is known only after collectstatic, and every command loads the URLs.
    return HttpResponsePermanentRedirect(static("favicon.svg"))


urlpatterns = [
    # Local, LDAP, OIDC and SAML login; logout ends the provider session too (docs/AUTH.md).
    path("login/", LoginView.as_view(), name="login"),
    path("oidc/", include("tenants.sso.urls")),
    path("saml/", include("tenants.sso.saml_urls")),
    path("logout/", LogoutView.as_view(), name="logout"),
    path("api/v1/", include("camp.api_urls")),
    # SCIM 2.0 provisioning for identity providers (tenants/scim; docs/AUTH.md).
    path("scim/v2/", include("tenants.scim.urls")),
    path("api/schema/", CachedSchemaView.as_view(), name="schema"),  # built once per process
    # Swagger UI with its init script fetched from ?script, not inline (Content-Security-Policy).
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("scheduling/", include("scheduling.urls")),
    path("workspaces/", include("workspaces.urls")),
    path("registry/", include("registry.urls")),
    path("metrics", portal_views.metrics, name="metrics"),
    # Browsers ask for /favicon.ico whatever the page links: no 404 on every page.
    path("favicon.ico", favicon),
    path("", include("portal.urls")),
    path("", include("tenants.urls")),
]

handler404 = "tenants.api.exceptions.not_found"
handler500 = "tenants.api.exceptions.server_error"
