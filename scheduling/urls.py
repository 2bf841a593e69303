from django.urls import path

from . import views, webhooks

app_name = "scheduling"

urlpatterns = [
    path("clusters/", views.cluster_list, name="clusters"),
    path("clusters/new/", views.cluster_edit, name="cluster-new"),
    path("clusters/<slug:cluster_name>/edit/", views.cluster_edit, name="cluster-edit"),
    path("clusters/<slug:cluster_name>/nodes/", views.node_list, name="nodes"),
    path("nodes/<int:pk>/quarantine/", views.node_quarantine, name="node-quarantine"),
    path("namespaces/", views.namespace_bindings, name="namespaces"),
    path("namespaces/<int:pk>/unbind/", views.namespace_unbind, name="namespace-unbind"),
    path("namespaces/priority-map/", views.priority_map_set, name="priority-map-set"),
    path("namespaces/priority-map/<int:pk>/delete/", views.priority_map_delete, name="priority-map-delete"),
    path("webhooks/batch-jobs", webhooks.batch_job_mutate, name="webhook-batch-jobs"),
    path("jobs/", views.job_list, name="jobs"),
    path("jobs/stop/", views.job_bulk_stop, name="jobs-stop"),
    path("jobs/live/", views.job_list_live, name="jobs-live"),
    path("jobs/<int:pk>/", views.job_detail, name="job"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
]
