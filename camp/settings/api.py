"""REST API: DRF, django-filter and drf-spectacular."""

from camp.env import env_bool, env_int

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenants.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON with bounded nesting (camp/parsers.py), forms and multipart as DRF's defaults.
    "DEFAULT_PARSER_CLASSES": [
        "camp.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": [
        "camp.filters.CampFilterBackend",
        "rest_framework.filters.OrderingFilter",
        "rest_framework.filters.SearchFilter",
    ],
    "DEFAULT_PAGINATION_CLASS": "camp.pagination.CampPagination",
    "PAGE_SIZE": env_int("API_PAGE_SIZE", 50),
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "tenants.api.exceptions.exception_handler",
    "DEFAULT_THROTTLE_RATES": {"anon": "60/min"},
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
}

API_SCHEMA_PUBLIC = env_bool("API_SCHEMA_PUBLIC", False)
SPECTACULAR_SETTINGS = {
    "TITLE": "Camp API",
    "DESCRIPTION": (
        "Camp: shared, fair, dense GPU scheduling on Kubernetes. "
        "Authenticate with a session or with `Authorization: Bearer <token>`. "
        "Create endpoints honour an `Idempotency-Key` header."
    ),
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/schema/ and /api/docs/ map every endpoint and field: for signed-in users (session
    # or token) unless API_SCHEMA_PUBLIC=true (issue 30, item 9).
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny" if API_SCHEMA_PUBLIC
                          else "rest_framework.permissions.IsAuthenticated"],
    "SWAGGER_UI_DIST": "SIDECAR",
    # ~150 operations and ~300 schemas: rendered collapsed (tags, no models list) the page is
    # usable sooner; the filter box finds a tag; deep links open one operation.
    "SWAGGER_UI_SETTINGS": {"docExpansion": "none", "defaultModelsExpandDepth": -1, "filter": True,
                            "deepLinking": True},
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": "/api/v1",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "tenants.api.schema.document_errors",
    ],
}
