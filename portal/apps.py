from django.apps import AppConfig


class PortalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "portal"

    def ready(self) -> None:
        from . import receivers  # noqa: F401  (scheduler signals → stats, live pages)
