from django.apps import AppConfig


class TenantsConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tenants"

    def ready(self) -> None:
        from .access import register_rules

        register_rules()  # tenancy's own models (each app above registers its own)
        from . import signals  # noqa: F401  (login/logout audit receivers)
        from .api import schema  # noqa: F401  (OpenAPI security scheme)
        from .sso import backchannel, checks  # noqa: F401  (SSO start-up checks; logout receiver)
