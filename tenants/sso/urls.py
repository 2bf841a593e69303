"""OIDC endpoints; the names are the ones mozilla-django-oidc reverses."""

from django.urls import path

from .views import OIDCAuthenticateView, OIDCCallbackView, backchannel_logout

urlpatterns = [
    path("authenticate/", OIDCAuthenticateView.as_view(), name="oidc_authentication_init"),
    path("callback/", OIDCCallbackView.as_view(), name="oidc_authentication_callback"),
    path("backchannel-logout/", backchannel_logout, name="oidc_backchannel_logout"),
]
