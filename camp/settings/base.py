"""Core Django settings."""

from pathlib import Path

import django_stubs_ext

from camp import logs
from camp.env import env_bool, env_list, env_str

# Lets ModelForm[Tenant] and Serializer[...] subscript at run time (typing only).
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent.parent
# The demo's working files (SQLite database, Celery's filesystem queue, beat schedule, locks,
# shared cache); VAR_DIR moves them, so a second demo (the newcomer browser test) runs beside one.
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))

# The demo default is deliberately marked insecure; production requires SECRET_KEY.
SECRET_KEY = env_str("SECRET_KEY", "django-insecure-camp-demo-key-change-me")
DEBUG = env_bool("DEBUG", True)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "csp",
    "camp",
    "tenants",
    "tenants.scim",
    "scheduling",
    "workspaces",
    "registry",
    "portal",
]

MIDDLEWARE = [
    # First: probes reach /healthz and /readyz by pod IP over plain HTTP (camp/health.py).
    "camp.health.HealthCheckMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "tenants.middleware.RequestContextMiddleware",
    # HTTP request rate, latency and status for /metrics (django-prometheus).
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "camp.logs.AccessLogMiddleware",
    # A bounded number of requests at once, a bounded queue, 503 beyond (camp/admission.py).
    "camp.admission.AdmissionMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The SAML session cookie (djangosaml2); does nothing unless SAML_ENABLED.
    "tenants.sso.saml_middleware.SAMLSessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Content-Security-Policy on every response (CONTENT_SECURITY_POLICY below).
    "csp.middleware.CSPMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # Last, as django-axes requires: it turns a lockout into a 429 page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "camp.urls"
AUTH_USER_MODEL = "tenants.User"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "console:home"
LOGOUT_REDIRECT_URL = "login"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "tenants.context_processors.console",
            ],
        },
    },
]

WSGI_APPLICATION = "camp.wsgi.application"
ASGI_APPLICATION = "camp.asgi.application"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# collectstatic's target (the container image collects at build time into /app/var/static).
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "static")))
STATICFILES_DIRS = [BASE_DIR / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Content-Security-Policy (django-csp) on every response: scripts, styles, images and
# connections from Camp's own origin only. No page has an inline script, event handler or style
# (bar widths are classes, camp/templatetags/camp_extras.py `pct`), so no 'unsafe-inline'; the
# JSON data blocks of `json_script` are not scripts. The API docs are Swagger UI from
# drf-spectacular-sidecar with its init script served separately (camp/urls.py). 'self' in
# connect-src covers the live pages' same-origin WebSocket (CSP level 3).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'", "data:"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# One format for web, worker, beat and watcher, with request/task/job/cluster ids (camp/logs.py).
# LOG_FORMAT: "text" here (the demo's terminal), "json" in production (camp/settings/production.py).
LOG_LEVEL = env_str("LOG_LEVEL", "INFO")
LOGGING = logs.config(env_str("LOG_FORMAT", "text"), LOG_LEVEL)
LOGGING_CONFIG = "camp.logs.configure"
