from django.urls import path

from . import views

app_name = "portal"

urlpatterns = [
    path("dashboard/", views.dashboard, name="dashboard"),
    path("t/<slug:tenant_name>/usage/", views.tenant_usage, name="tenant-usage"),
]
