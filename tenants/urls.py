from django.urls import path

from . import views

app_name = "console"

urlpatterns = [
    path("", views.home, name="home"),
    path("t/<slug:tenant_name>/", views.tenant_detail, name="tenant"),
    path("t/<slug:tenant_name>/quota/", views.tenant_quota, name="tenant-quota"),
    path("t/<slug:tenant_name>/p/<slug:project_name>/", views.project_detail, name="project"),
    path("t/<slug:tenant_name>/p/<slug:project_name>/quota/", views.project_quota, name="project-quota"),
    path("t/<slug:tenant_name>/p/<slug:project_name>/delete/", views.project_delete,
         name="project-delete"),
    path("memberships/<int:pk>/", views.membership_change, name="membership-change"),
    path("audit/", views.audit_log, name="audit"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("admin/tenants/", views.admin_tenants, name="admin-tenants"),
    path("admin/users/", views.admin_users, name="admin-users"),
    path("admin/users/<int:pk>/toggle/", views.admin_user_toggle, name="admin-user-toggle"),
    path("admin/clusters/<slug:cluster_name>/quota/", views.cluster_quota, name="cluster-quota"),
]
