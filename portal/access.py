"""Access rules of the portal's observations (tenants/permissions.py explains the rules).

Registered from ``PortalConfig.ready()``. Users see these only as aggregates (cluster
dashboards, showback, /metrics) behind checks on the tenant or the platform admin role.
"""

from __future__ import annotations

from tenants.permissions import TENANT_MEMBER, Internal, PlatformOnly, register

from .models import ClusterSample, CycleStat, DemoLoad, DispatchError, Price, UsageSample


def register_rules() -> None:
    for model in (ClusterSample, UsageSample, CycleStat, DispatchError):
        register(model, Internal("a time series shown as aggregates (dashboards, showback, "
                                 "/metrics) behind tenant or platform-admin checks"))
    register(DemoLoad, Internal("the demo's load generator, switched by portal.services"))
    # Prices are set by platform admins and read by everyone in a tenant (showback's cost).
    register(Price, PlatformOnly(view=TENANT_MEMBER))
