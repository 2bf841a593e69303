from django.apps import AppConfig


class ScimConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "tenants.scim"
    label = "scim"
    verbose_name = "SCIM provisioning"
