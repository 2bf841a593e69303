"""Model services' writes moved into the services package (``workspaces/services/serving.py``)
when it was split by concern; this name stays so that code written against it keeps working.
New code imports from ``workspaces.services``."""

from .services.serving import (  # noqa: F401
    AUTOSCALER,
    LABEL_REVISION,
    LABEL_SERVICE,
    SERVICE_KIND,
    model_service_autoscale,
    model_service_create,
    model_service_delete,
    model_service_rollout,
    model_service_scale,
    model_service_update,
    model_services_autoscale,
    service_manifest,
)
