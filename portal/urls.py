from django.urls import path

from . import views

app_name = "portal"

urlpatterns = [
    path("dashboard/", views.dashboard, name="dashboard"),
    path("t/<slug:tenant_name>/usage/", views.tenant_usage, name="tenant-usage"),
    path("admin/clusters/<slug:cluster_name>/gpus/", views.gpu_map, name="gpu-map"),
    path("admin/clusters/<slug:cluster_name>/queues/", views.queues, name="queues"),
    path("admin/preemptions/", views.preemptions, name="preemptions"),
    path("admin/demo-load/", views.demo_load, name="demo-load"),
    path("admin/prices/", views.prices, name="prices"),
]
