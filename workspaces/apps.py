from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "workspaces"

    def ready(self) -> None:
        from scheduling.extensions import register_job_spec_hook

        from .access import register_rules
        from .pods import workload_job_spec_hook

        register_rules()  # this app's models' access rules (tenants.permissions)
        register_job_spec_hook(workload_job_spec_hook)
