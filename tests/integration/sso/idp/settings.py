"""A tiny OpenID provider for the SSO tests: django-oauth-toolkit with OIDC and PKCE on.

Runs as its own process (``python -m django runserver`` with this module), never
inside Camp's settings. Everything comes from the environment the fixture sets.
"""

import os

SECRET_KEY = "idp-test-only-not-secret"  # noqa: S105
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "oauth2_provider",
    "tests.integration.sso.idp",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.integration.sso.idp.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["IDP_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
LOGIN_URL = "/accounts/login/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The IdP and Camp both run on 127.0.0.1 with different ports; cookies are per
# host, not per port, so give the IdP its own cookie names.
SESSION_COOKIE_NAME = "idp_sessionid"
CSRF_COOKIE_NAME = "idp_csrftoken"

OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_RSA_PRIVATE_KEY": os.environ["IDP_RSA_PRIVATE_KEY"],
    "OIDC_ISS_ENDPOINT": os.environ["IDP_ISSUER"],
    "PKCE_REQUIRED": True,
    "OAUTH2_VALIDATOR_CLASS": "tests.integration.sso.idp.validator.ClaimsFileValidator",
    "SCOPES": {"openid": "OpenID Connect", "email": "E-mail", "profile": "Profile"},
}
