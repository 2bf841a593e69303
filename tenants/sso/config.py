"""Builders for the authentication settings (used by camp/settings/auth.py and the tests).

They take plain values (read from the environment by the settings module) and
return the dicts of Django / mozilla-django-oidc / django-auth-ldap settings, so
the settings module stays declarative and the tests configure exactly what a
deployment would. No models are imported here.
"""

from __future__ import annotations

import importlib.util
from typing import Any

AXES_BACKEND = "axes.backends.AxesStandaloneBackend"
LOCAL_BACKEND = "tenants.sso.local.LocalModelBackend"
LDAP_BACKEND = "tenants.sso.ldap.CampLDAPBackend"
OIDC_BACKEND = "tenants.sso.oidc.CampOIDCBackend"

LDAP_GROUP_TYPES = (
    "groupOfNames", "groupOfUniqueNames", "posixGroup", "nestedGroupOfNames",
    "activeDirectory", "nestedActiveDirectory", "memberOf", "none",
)


LDAP_EXTRA_HINT = (
    "LDAP_ENABLED is true but the LDAP extra is not installed: "
    "pip install -r requirements-ldap.txt (python-ldap builds from source and needs "
    "gcc, libldap2-dev and libsasl2-dev; the container image includes it)"
)


def ldap_extra_installed() -> bool:
    """django-auth-ldap and python-ldap are an optional extra (requirements-ldap.txt)."""
    return all(importlib.util.find_spec(name) is not None for name in ("ldap", "django_auth_ldap"))


class AuthConfigError(ValueError):
    """A setting is missing or wrong; the message names the environment variable."""


def authentication_backends(*, local: bool, ldap: bool, oidc: bool) -> list[str]:
    # django-axes first: it refuses locked-out credentials before any backend
    # (local or LDAP) checks a password. Local before LDAP: a local account's
    # password never travels to the directory.
    backends = [AXES_BACKEND]
    if local:
        backends.append(LOCAL_BACKEND)
    if ldap and ldap_extra_installed():  # else the system check camp.E001 stops start-up
        backends.append(LDAP_BACKEND)
    if oidc:
        backends.append(OIDC_BACKEND)
    return backends


def oidc_settings(
    *,
    enabled: bool,
    issuer: str,
    client_id: str,
    client_secret: str,
    authorization_endpoint: str,
    token_endpoint: str,
    userinfo_endpoint: str,
    jwks_endpoint: str,
    sign_algo: str = "RS256",
    scopes: str = "openid email profile",
    verify_ssl: bool = True,
    timeout: int = 10,
) -> dict[str, Any]:
    """mozilla-django-oidc settings: authorization code flow with PKCE (S256) and nonce."""
    if enabled:
        required = {
            "OIDC_ISSUER": issuer, "OIDC_CLIENT_ID": client_id,
            "OIDC_CLIENT_SECRET": client_secret,
            "OIDC_AUTHORIZATION_ENDPOINT": authorization_endpoint,
            "OIDC_TOKEN_ENDPOINT": token_endpoint,
        }
        if sign_algo.startswith(("RS", "ES")):
            required["OIDC_JWKS_ENDPOINT"] = jwks_endpoint
        missing = [name for name, value in required.items() if not value]
        if missing:
            raise AuthConfigError(f"OIDC_ENABLED is true but {', '.join(missing)} is not set")
        if "openid" not in scopes.split():
            raise AuthConfigError("OIDC_SCOPES must include openid")
    return {
        "OIDC_ENABLED": enabled,
        "OIDC_ISSUER": issuer,
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": client_secret,
        "OIDC_OP_AUTHORIZATION_ENDPOINT": authorization_endpoint,
        "OIDC_OP_TOKEN_ENDPOINT": token_endpoint,
        "OIDC_OP_USER_ENDPOINT": userinfo_endpoint,
        "OIDC_OP_JWKS_ENDPOINT": jwks_endpoint or None,
        "OIDC_RP_SIGN_ALGO": sign_algo,
        "OIDC_RP_SCOPES": scopes,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_USE_NONCE": True,
        "OIDC_VERIFY_SSL": verify_ssl,
        "OIDC_TIMEOUT": timeout,
        # Tokens are used once, at login, and never kept in the session.
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": False,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
    }


def ldap_settings(
    *,
    enabled: bool,
    server_uri: str,
    bind_dn: str = "",
    bind_password: str = "",
    start_tls: bool = False,
    ca_cert_file: str = "",
    user_search_base: str = "",
    user_filter: str = "(uid=%(user)s)",
    group_type: str = "groupOfNames",
    group_search_base: str = "",
    group_filter: str = "",
    attr_first_name: str = "givenName",
    attr_last_name: str = "sn",
    attr_email: str = "mail",
    timeout: int = 10,
) -> dict[str, Any]:
    """django-auth-ldap settings: bind with a service account, search the user, read groups."""
    if not enabled:
        return {"LDAP_ENABLED": False, "LDAP_GROUP_SOURCE": "none"}
    missing = [n for n, v in {"LDAP_SERVER_URI": server_uri,
                               "LDAP_USER_SEARCH_BASE": user_search_base}.items() if not v]
    if group_type not in LDAP_GROUP_TYPES:
        raise AuthConfigError(f"LDAP_GROUP_TYPE must be one of {', '.join(LDAP_GROUP_TYPES)}")
    searching = group_type not in ("memberOf", "none")
    if searching and not group_search_base:
        missing.append("LDAP_GROUP_SEARCH_BASE")
    if missing:
        raise AuthConfigError(f"LDAP_ENABLED is true but {', '.join(missing)} is not set")
    if "%(user)s" not in user_filter:
        raise AuthConfigError("LDAP_USER_FILTER must contain %(user)s")
    if not ldap_extra_installed():
        # The settings still load so that `manage.py doctor` and the system check
        # (camp/checks.py) can say what is missing; the web process refuses to start.
        return {"LDAP_ENABLED": True, "LDAP_EXTRA_MISSING": True, "LDAP_GROUP_SOURCE": "none"}
    import ldap
    from django_auth_ldap import config as c

    options: dict[Any, Any] = {
        ldap.OPT_REFERRALS: 0,  # Active Directory: do not chase referrals anonymously
        ldap.OPT_NETWORK_TIMEOUT: timeout,
        ldap.OPT_TIMEOUT: timeout,
    }
    if ca_cert_file:
        options[ldap.OPT_X_TLS_CACERTFILE] = ca_cert_file
        options[ldap.OPT_X_TLS_NEWCTX] = 0
    result: dict[str, Any] = {
        "LDAP_ENABLED": True,
        "LDAP_GROUP_SOURCE": {"memberOf": "memberOf", "none": "none"}.get(group_type, "search"),
        "AUTH_LDAP_SERVER_URI": server_uri,
        "AUTH_LDAP_BIND_DN": bind_dn,
        "AUTH_LDAP_BIND_PASSWORD": bind_password,
        "AUTH_LDAP_START_TLS": start_tls,
        "AUTH_LDAP_CONNECTION_OPTIONS": options,
        # "+"-less attribute lists omit operational attributes such as OpenLDAP's memberOf.
        "AUTH_LDAP_USER_SEARCH": c.LDAPSearch(
            user_search_base, ldap.SCOPE_SUBTREE, user_filter,
            ["*", "memberOf"] if group_type == "memberOf" else None),
        "AUTH_LDAP_USER_ATTR_MAP": {
            k: v for k, v in {"first_name": attr_first_name, "last_name": attr_last_name,
                              "email": attr_email}.items() if v
        },
        "AUTH_LDAP_ALWAYS_UPDATE_USER": True,
        "AUTH_LDAP_MIRROR_GROUPS": False,
        "AUTH_LDAP_FIND_GROUP_PERMS": False,
        "AUTH_LDAP_CACHE_TIMEOUT": 0,  # groups are re-read at every login (re-sync)
    }
    if searching:
        group_types: dict[str, Any] = {
            "groupOfNames": (c.GroupOfNamesType, "(objectClass=groupOfNames)"),
            "nestedGroupOfNames": (c.NestedGroupOfNamesType, "(objectClass=groupOfNames)"),
            "groupOfUniqueNames": (c.GroupOfUniqueNamesType, "(objectClass=groupOfUniqueNames)"),
            "posixGroup": (c.PosixGroupType, "(objectClass=posixGroup)"),
            "activeDirectory": (c.ActiveDirectoryGroupType, "(objectClass=group)"),
            "nestedActiveDirectory": (c.NestedActiveDirectoryGroupType, "(objectClass=group)"),
        }
        type_class, default_filter = group_types[group_type]
        result["AUTH_LDAP_GROUP_TYPE"] = type_class(name_attr="cn")
        result["AUTH_LDAP_GROUP_SEARCH"] = c.LDAPSearch(
            group_search_base, ldap.SCOPE_SUBTREE, group_filter or default_filter
        )
    return result
