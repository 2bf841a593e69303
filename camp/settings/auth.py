"""Authentication: local accounts, LDAP, OpenID Connect and SAML, switched on by environment.

Every variable is documented in docs/AUTH.md. The builders live in
tenants/sso/config.py so that the tests configure exactly what a deployment does.
"""

from camp.env import ImproperlyConfiguredEnv, env_bool, env_int, env_str
from tenants.sso import config as _sso
from tenants.sso.mapping import MappingError, parse_group_roles

LOCAL_LOGIN_ENABLED = env_bool("LOCAL_LOGIN_ENABLED", True)
LDAP_ENABLED = env_bool("LDAP_ENABLED", False)
OIDC_ENABLED = env_bool("OIDC_ENABLED", False)
SAML_ENABLED = env_bool("SAML_ENABLED", False)

AUTHENTICATION_BACKENDS = _sso.authentication_backends(
    local=LOCAL_LOGIN_ENABLED, ldap=LDAP_ENABLED, oidc=OIDC_ENABLED, saml=SAML_ENABLED
)

# One group → role mapping for OIDC, SAML and LDAP (tenants/sso/mapping.py).
try:
    SSO_GROUP_ROLES = parse_group_roles(env_str("SSO_GROUP_ROLES", ""))
except MappingError as exc:
    raise ImproperlyConfiguredEnv(str(exc)) from exc

# --- OpenID Connect (mozilla-django-oidc): code flow, PKCE S256, state and nonce, discovery --
try:
    globals().update(_sso.oidc_settings(
        enabled=OIDC_ENABLED,
        issuer=env_str("OIDC_ISSUER"),
        client_id=env_str("OIDC_CLIENT_ID"),
        client_secret=env_str("OIDC_CLIENT_SECRET"),
        authorization_endpoint=env_str("OIDC_AUTHORIZATION_ENDPOINT"),
        token_endpoint=env_str("OIDC_TOKEN_ENDPOINT"),
        userinfo_endpoint=env_str("OIDC_USERINFO_ENDPOINT"),
        jwks_endpoint=env_str("OIDC_JWKS_ENDPOINT"),
        end_session_endpoint=env_str("OIDC_END_SESSION_ENDPOINT"),
        sign_algo=env_str("OIDC_SIGN_ALGO", "RS256"),
        scopes=env_str("OIDC_SCOPES", "openid email profile"),
        verify_ssl=env_bool("OIDC_VERIFY_SSL", True),
        timeout=env_int("OIDC_TIMEOUT_SECONDS", 10),
        clock_skew_seconds=env_int("OIDC_CLOCK_SKEW_SECONDS", 60),
        discovery_cache_seconds=env_int("OIDC_DISCOVERY_CACHE_SECONDS", 3600),
        jwks_cache_seconds=env_int("OIDC_JWKS_CACHE_SECONDS", 3600),
        logout_at_provider=env_bool("OIDC_LOGOUT_AT_PROVIDER", True),
        token_auth_method=env_str("OIDC_TOKEN_AUTH_METHOD", ""),
    ))
    # --- SAML 2.0 service provider (djangosaml2 + pysaml2 + Debian xmlsec1) ------------------
    globals().update(_sso.saml_settings(
        enabled=SAML_ENABLED,
        base_url=env_str("SAML_BASE_URL"),
        sp_entity_id=env_str("SAML_SP_ENTITY_ID"),
        idp_metadata_url=env_str("SAML_IDP_METADATA_URL"),
        idp_metadata_file=env_str("SAML_IDP_METADATA_FILE"),
        sp_key_file=env_str("SAML_SP_KEY_FILE"),
        sp_cert_file=env_str("SAML_SP_CERT_FILE"),
        want_response_signed=env_bool("SAML_WANT_RESPONSE_SIGNED", False),
        nameid_format=env_str("SAML_NAMEID_FORMAT", "persistent"),
        clock_skew_seconds=env_int("SAML_CLOCK_SKEW_SECONDS", 60),
        attr_username=env_str("SAML_ATTR_USERNAME", "uid"),
        attr_email=env_str("SAML_ATTR_EMAIL", "mail"),
        attr_first_name=env_str("SAML_ATTR_FIRST_NAME", "givenName"),
        attr_last_name=env_str("SAML_ATTR_LAST_NAME", "sn"),
        attr_groups=env_str("SAML_ATTR_GROUPS", "groups"),
        create_user=env_bool("SAML_CREATE_USER", True),
        metadata_cache_seconds=env_int("SAML_METADATA_CACHE_SECONDS", 3600),
        timeout=env_int("SAML_TIMEOUT_SECONDS", 10),
        xmlsec_binary=env_str("SAML_XMLSEC_BINARY", "xmlsec1"),
    ))
    # --- LDAP (django-auth-ldap): service bind, user search, groups -------------------------
    globals().update(_sso.ldap_settings(
        enabled=LDAP_ENABLED,
        server_uri=env_str("LDAP_SERVER_URI"),
        bind_dn=env_str("LDAP_BIND_DN"),
        bind_password=env_str("LDAP_BIND_PASSWORD"),
        start_tls=env_bool("LDAP_START_TLS", False),
        ca_cert_file=env_str("LDAP_CA_CERT_FILE"),
        user_search_base=env_str("LDAP_USER_SEARCH_BASE"),
        user_filter=env_str("LDAP_USER_FILTER", "(uid=%(user)s)"),
        group_type=env_str("LDAP_GROUP_TYPE", "groupOfNames"),
        group_search_base=env_str("LDAP_GROUP_SEARCH_BASE"),
        group_filter=env_str("LDAP_GROUP_FILTER"),
        attr_first_name=env_str("LDAP_ATTR_FIRST_NAME", "givenName"),
        attr_last_name=env_str("LDAP_ATTR_LAST_NAME", "sn"),
        attr_email=env_str("LDAP_ATTR_EMAIL", "mail"),
        timeout=env_int("LDAP_TIMEOUT_SECONDS", 10),
    ))
except _sso.AuthConfigError as exc:
    raise ImproperlyConfiguredEnv(str(exc)) from exc

OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
SAML_PROVIDER_NAME = env_str("SAML_PROVIDER_NAME", "SAML single sign-on")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_CREATE_USER = env_bool("OIDC_CREATE_USER", True)

# --- Throttling (django-axes) ----------------------------------------------------------------
# Lock a (username, client IP) pair after N failures, and a client IP on its own after
# LOGIN_FAILURE_LIMIT_PER_IP; a success clears only its own account's failures there
# (CampAxesHandler). Never a username alone: failures from one
# address must not lock the account's owner out elsewhere. Covers every password login
# (local and LDAP) and failed OIDC/SAML sign-ins.
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
LOGIN_FAILURE_LIMIT_PER_IP = env_int("LOGIN_FAILURE_LIMIT_PER_IP", 20)
AXES_HANDLER = "tenants.sso.local.CampAxesHandler"
AXES_COOLOFF_TIME = env_int("LOGIN_COOLOFF_MINUTES", 15) / 60  # hours
# (Sign-ins without a username — OIDC, SAML — count per IP only: tenants/sso/local.py.)
AXES_LOCKOUT_PARAMETERS = "tenants.sso.local.lockout_parameters"
# Behind reverse proxies, the client address comes from X-Forwarded-For (the same rule as the
# audit log's client IP): set TRUSTED_PROXY_COUNT to the number of proxies in front of Camp.
TRUSTED_PROXY_COUNT = env_int("TRUSTED_PROXY_COUNT", 0)
AXES_CLIENT_IP_CALLABLE = "tenants.middleware.client_ip"
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"
AXES_VERBOSE = False
# Never store the attempted password; axes stores the username and IP only.
AXES_SENSITIVE_PARAMETERS = ["password"]
