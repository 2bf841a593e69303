from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "scheduling"

    def ready(self) -> None:
        from tenants.extensions import (
            register_all_cluster_held,
            register_cluster_model,
            register_gpu_model_classes,
            register_guarantee_view,
            register_guarantee_warnings,
        )

        from .access import register_rules
        from .accounting import guarantee_view, guarantee_warnings
        from .models import Cluster
        from .selectors import all_cluster_held, gpu_model_classes

        register_rules()  # this app's models' access rules (tenants.permissions)
        register_cluster_model(Cluster)  # what cluster quotas attach to (tenants.Quota.cluster)
        register_gpu_model_classes(gpu_model_classes)  # quota memory limits per GPU class
        register_all_cluster_held(all_cluster_held)  # the quota pages' usage across clusters
        register_guarantee_warnings(guarantee_warnings)  # flagged where set (issue 29)
        register_guarantee_view(guarantee_view)  # the quota-by-cluster view (issue 32)
