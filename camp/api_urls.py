"""/api/v1/: one router for every app's viewsets."""

from rest_framework.routers import DefaultRouter

from portal import api as portal_api
from registry.api import views as registry_views
from scheduling.api import views as scheduling_views
from tenants.api import views as tenant_views
from workspaces.api import views as workspace_views

router = DefaultRouter()
router.register("tenants", tenant_views.TenantViewSet, basename="tenant")
router.register("projects", tenant_views.ProjectViewSet, basename="project")
router.register("memberships", tenant_views.MembershipViewSet, basename="membership")
router.register("quotas", tenant_views.QuotaViewSet, basename="quota")
router.register("users", tenant_views.UserViewSet, basename="user")
router.register("tokens", tenant_views.ApiTokenViewSet, basename="token")
router.register("scim-tokens", tenant_views.ScimTokenViewSet, basename="scimtoken")
router.register("audit-events", tenant_views.AuditEventViewSet, basename="auditevent")
router.register("clusters", scheduling_views.ClusterViewSet, basename="cluster")
router.register("nodes", scheduling_views.NodeViewSet, basename="node")
router.register("pools", scheduling_views.NodePoolViewSet, basename="nodepool")
router.register("jobs", scheduling_views.JobViewSet, basename="job")
router.register("namespace-bindings", scheduling_views.NamespaceBindingViewSet, basename="namespacebinding")
router.register("priority-class-mappings", scheduling_views.PriorityClassMappingViewSet,
                basename="priorityclassmapping")
router.register("environments", workspace_views.EnvironmentViewSet, basename="environment")
router.register("training-jobs", workspace_views.TrainingViewSet, basename="trainingjob")
router.register("profiles", workspace_views.ProfileViewSet, basename="profile")
router.register("workspace-policies", workspace_views.PolicyViewSet, basename="workspacepolicy")
router.register("services", workspace_views.ModelServiceViewSet, basename="modelservice")
router.register("ssh-keys", workspace_views.SshKeyViewSet, basename="sshkey")
router.register("images", registry_views.ImageViewSet, basename="image")
router.register("registries", registry_views.RegistryViewSet, basename="registry")
router.register("prices", portal_api.PriceViewSet, basename="price")
router.register("usage", portal_api.UsageViewSet, basename="usage")

urlpatterns = router.urls
