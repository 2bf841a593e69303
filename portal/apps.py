from django.apps import AppConfig


class PortalConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "portal"

    def ready(self) -> None:
        from tenants.extensions import register_home_section

        from . import receivers  # noqa: F401  (scheduler signals → stats, live pages)
        from .access import register_rules
        from .home import home

        register_rules()  # this app's models' access rules (tenants.permissions)
        # The console home's panels (tenants/views.home includes the template).
        register_home_section("portal/home_sections.html", home)
