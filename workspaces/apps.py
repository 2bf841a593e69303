from django.apps import AppConfig


class WorkspacesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "workspaces"

    def ready(self) -> None:
        from scheduling.extensions import register_cluster_users, register_job_spec_hook

        from . import services  # noqa: F401 (registers the workload kinds: environment, training, service)
        from .access import register_rules
        from .kinds import kinds_job_spec_hook
        from .selectors import floating_trainings_on

        register_rules()  # this app's models' access rules (tenants.permissions)
        register_job_spec_hook(kinds_job_spec_hook)
        register_cluster_users(floating_trainings_on)
