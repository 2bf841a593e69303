"""Production hardening on top of the default settings.

``manage.py check --deploy --fail-level WARNING`` passes with these (a test checks it).
"""

from camp import logs
from camp.env import ImproperlyConfiguredEnv, env_bool, env_int, env_is_set, env_list, env_str

from . import *  # noqa: F403
from .base import LOG_LEVEL

DEBUG = False
# Sessions, CSRF, password-reset tokens and the key that encrypts cluster credentials rest on
# SECRET_KEY: refuse one a guesser could find (Django's own check asks for 50 characters).
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY or SECRET_KEY.startswith("django-insecure"):
    raise ImproperlyConfiguredEnv("SECRET_KEY (or SECRET_KEY_FILE) must be set to a long random value in "
                                  "production: python3 -c 'import secrets; print(secrets.token_urlsafe(50))'")
if len(SECRET_KEY) < SECRET_KEY_MIN_LENGTH:
    raise ImproperlyConfiguredEnv(f"SECRET_KEY has {len(SECRET_KEY)} characters; production needs at least "
                                  f"{SECRET_KEY_MIN_LENGTH} random ones: python3 -c 'import secrets; "
                                  "print(secrets.token_urlsafe(50))'")
# No silent fallback to the development hosts (which include "testserver").
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
if not ALLOWED_HOSTS:
    raise ImproperlyConfiguredEnv("ALLOWED_HOSTS must name the host names Camp answers to in production "
                                  "(comma-separated, e.g. camp.example.com)")
# Production never falls back to the demo's SQLite file ("unable to open database file" at the
# first request, or worse, a private database per container).
if not env_is_set("DATABASE_URL"):
    raise ImproperlyConfiguredEnv("DATABASE_URL (or DATABASE_URL_FILE) must be set in production: "
                                  "postgres://user:password@host:5432/camp")

SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
if not SECURE_SSL_REDIRECT:
    # docker-compose's localhost convenience: said at every process's start, so nobody runs a
    # public host this way unawares (`manage.py doctor` fails on it for a non-loopback host).
    import sys

    sys.stderr.write("WARNING: SECURE_SSL_REDIRECT=false: plain HTTP is accepted; fine on localhost "
                     "only. Behind a TLS proxy set SECURE_SSL_REDIRECT=true (docs/DEPLOY.md).\n")
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = False
METRICS_PUBLIC = env_bool("METRICS_PUBLIC", False)
# The environment access cookie is Secure in production (the ingress auth request is HTTP).
WORKSPACES_COOKIE_SECURE = env_bool("WORKSPACES_COOKIE_SECURE", True)

# Logs: one JSON object a line with request/task/job/cluster ids (camp/logs.py); LOG_FORMAT=text
# for key=value lines.

LOGGING = logs.config(env_str("LOG_FORMAT", "json"), LOG_LEVEL)
