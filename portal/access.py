"""Access rules of the portal's observations (tenants/permissions.py explains the rules).

Registered from ``PortalConfig.ready()``. The portal shows these as aggregates (cluster
dashboards, showback, /metrics); the rules say whose they are.
"""

from __future__ import annotations

from tenants.permissions import NOBODY, TENANT_OWNER, PlatformOnly, TenantScoped, register

from .models import ClusterSample, CycleStat, DemoLoad, DispatchError, UsageSample


def register_rules() -> None:
    # Cluster-wide state, scheduler statistics and the demo's load generator: platform admins.
    for model in (ClusterSample, CycleStat, DispatchError, DemoLoad):
        register(model, PlatformOnly(view=NOBODY))
    # Usage per project and user is the tenant owners' report (showback), like the audit log.
    register(UsageSample, TenantScoped(view=TENANT_OWNER))
