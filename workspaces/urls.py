from django.urls import path

from . import views

app_name = "workspaces"

urlpatterns = [
    path("environments/", views.environment_list, name="environments"),
    path("environments/new/", views.environment_new, name="environment-new"),
    path("environments/<int:pk>/", views.environment_detail, name="environment"),
    path("environments/<int:pk>/<str:op>/", views.environment_action, name="environment-action"),
    path("training/", views.training_list, name="trainings"),
    path("training/new/", views.training_new, name="training-new"),
    path("training/<int:pk>/", views.training_detail, name="training"),
    path("training/<int:pk>/stop/", views.training_stop, name="training-stop"),
    path("services/", views.service_list, name="services"),
    path("services/new/", views.service_new, name="service-new"),
    path("services/live/", views.service_list_live, name="services-live"),
    path("services/<int:pk>/", views.service_detail, name="service"),
    path("services/<int:pk>/scale/", views.service_scale, name="service-scale"),
    path("services/<int:pk>/api-key/", views.service_api_key, name="service-api-key"),
    path("services/<int:pk>/auth/", views.service_auth, name="service-auth"),
    path("services/<int:pk>/delete/", views.service_delete, name="service-delete"),
    path("policy/<int:project_id>/", views.policy_edit, name="policy"),
    path("profiles/", views.profile_list, name="profiles"),
    path("profiles/new/", views.preset_edit, name="preset-new"),
    path("profiles/<int:pk>/edit/", views.preset_edit, name="preset-edit"),
    path("ssh-keys/", views.ssh_keys, name="ssh-keys"),
    path("ssh-keys/<int:pk>/delete/", views.ssh_key_delete, name="ssh-key-delete"),
    # ingress-nginx external auth for environment URLs (no login redirect: 200 or 401)
    path("auth/<int:pk>/", views.environment_auth, name="auth"),
    path("simulated/<path:rest>", views.simulated_app, name="simulated-app"),
]
