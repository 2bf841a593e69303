from django.apps import AppConfig


class RegistryConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "registry"

    def ready(self) -> None:
        from .access import register_rules

        register_rules()  # this app's models' access rules (tenants.permissions)
