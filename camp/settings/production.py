"""Production hardening on top of the default settings.

``manage.py check --deploy --fail-level WARNING`` passes with these (a test checks it).
"""

from camp import logs
from camp.env import ImproperlyConfiguredEnv, env_bool, env_int, env_is_set, env_str

from . import *  # noqa: F403
from .base import ALLOWED_HOSTS, LOG_LEVEL  # noqa: F401

DEBUG = False
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY or SECRET_KEY.startswith("django-insecure"):
    raise RuntimeError("SECRET_KEY (or SECRET_KEY_FILE) must be set to a long random value")
# Production never falls back to the demo's SQLite file ("unable to open database file" at the
# first request, or worse, a private database per container).
if not env_is_set("DATABASE_URL"):
    raise ImproperlyConfiguredEnv("DATABASE_URL (or DATABASE_URL_FILE) must be set in production: "
                                  "postgres://user:password@host:5432/camp")

SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
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
