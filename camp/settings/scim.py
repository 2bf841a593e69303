"""SCIM 2.0 provisioning (tenants/scim on django-scim2; docs/AUTH.md, "SCIM provisioning")."""

import re

from django.core.exceptions import ImproperlyConfigured

from camp.env import env_str


def _rate(name: str, default: str) -> str:
    """A DRF rate, ``<n>/<s|sec|min|hour|day>``; anything else stops start-up naming ``name``."""
    value = env_str(name, default)
    if not re.fullmatch(r"[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)", value):
        raise ImproperlyConfigured(f"{name} must look like 600/min, not {value!r}")
    return value


SCIM_SERVICE_PROVIDER = {
    "USER_MODEL_GETTER": "tenants.scim.hooks.user_model",
    "USER_ADAPTER": "tenants.scim.adapters.CampScimUser",
    "GROUP_MODEL": "tenants.scim.models.ScimGroup",
    "GROUP_ADAPTER": "tenants.scim.adapters.CampScimGroup",
    "USER_FILTER_PARSER": "tenants.scim.hooks.CampUserFilter",
    "GROUP_FILTER_PARSER": "tenants.scim.hooks.CampGroupFilter",
    "SERVICE_PROVIDER_CONFIG_MODEL": "tenants.scim.adapters.CampServiceProviderConfig",
    "BASE_LOCATION_GETTER": "tenants.scim.hooks.base_location",
    "GET_EXTRA_MODEL_FILTER_KWARGS_GETTER": "tenants.scim.hooks.provider_filter",
    "AUTH_CHECK_MIDDLEWARE": "tenants.scim.hooks.ScimBearerAuth",
    "SCHEMAS_GETTER": "tenants.scim.hooks.schemas",
    # Mandatory in django-scim2 but unused: locations come from the request (base_location).
    "NETLOC": "camp",
    "AUTHENTICATION_SCHEMES": [{"type": "oauthbearertoken", "name": "Bearer token"}],
    "WWW_AUTHENTICATE_HEADER": 'Bearer realm="camp-scim"',
}
# Requests per SCIM token (Okta sends at most a few hundred a minute in a full push).
SCIM_THROTTLE_RATE = _rate("SCIM_THROTTLE_RATE", "1200/min")
# Failed SCIM authentications per client address.
SCIM_AUTH_FAILURE_RATE = _rate("SCIM_AUTH_FAILURE_RATE", "30/min")
