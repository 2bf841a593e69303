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
SAML_BACKEND = "tenants.sso.saml.CampSAMLBackend"

LDAP_GROUP_TYPES = (
    "groupOfNames", "groupOfUniqueNames", "posixGroup", "nestedGroupOfNames",
    "activeDirectory", "nestedActiveDirectory", "memberOf", "none",
)


# Client authentication at the token endpoint (tenants/sso/discovery.py decides when empty).
TOKEN_AUTH_METHODS = ("client_secret_basic", "client_secret_post")

SIGN_ALGOS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
              "HS256")


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


def authentication_backends(*, local: bool, ldap: bool, oidc: bool,
                            saml: bool = False) -> list[str]:
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
    if saml:
        backends.append(SAML_BACKEND)
    return backends


def oidc_settings(
    *,
    enabled: bool,
    issuer: str,
    client_id: str,
    client_secret: str,
    authorization_endpoint: str = "",
    token_endpoint: str = "",
    userinfo_endpoint: str = "",
    jwks_endpoint: str = "",
    end_session_endpoint: str = "",
    sign_algo: str = "RS256",
    scopes: str = "openid email profile",
    verify_ssl: bool = True,
    timeout: int = 10,
    clock_skew_seconds: int = 60,
    discovery_cache_seconds: int = 3600,
    jwks_cache_seconds: int = 3600,
    logout_at_provider: bool = True,
    token_auth_method: str = "",
) -> dict[str, Any]:
    """mozilla-django-oidc settings: authorization code flow with PKCE (S256) and nonce.

    Endpoints left empty come from the provider's discovery document at login time
    (tenants/sso/discovery.py); any set here override it.
    """
    if enabled:
        required = {"OIDC_ISSUER": issuer, "OIDC_CLIENT_ID": client_id,
                    "OIDC_CLIENT_SECRET": client_secret}
        missing = [name for name, value in required.items() if not value]
        if missing:
            raise AuthConfigError(f"OIDC_ENABLED is true but {', '.join(missing)} is not set")
        if not issuer.startswith(("https://", "http://")):
            raise AuthConfigError("OIDC_ISSUER must be the provider's issuer URL (https://…)")
        if "openid" not in scopes.split():
            raise AuthConfigError("OIDC_SCOPES must include openid")
        if not 0 <= clock_skew_seconds <= 300:
            raise AuthConfigError("OIDC_CLOCK_SKEW_SECONDS must be between 0 and 300")
        if sign_algo not in SIGN_ALGOS:
            raise AuthConfigError(f"OIDC_SIGN_ALGO must be one of {', '.join(SIGN_ALGOS)}")
        if token_auth_method and token_auth_method not in TOKEN_AUTH_METHODS:
            raise AuthConfigError("OIDC_TOKEN_AUTH_METHOD must be empty (from discovery) or "
                                  f"one of {', '.join(TOKEN_AUTH_METHODS)}")
    return {
        "OIDC_ENABLED": enabled,
        "OIDC_ISSUER": issuer,
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": client_secret,
        "OIDC_OP_AUTHORIZATION_ENDPOINT": authorization_endpoint,
        "OIDC_OP_TOKEN_ENDPOINT": token_endpoint,
        "OIDC_OP_USER_ENDPOINT": userinfo_endpoint,
        "OIDC_OP_JWKS_ENDPOINT": jwks_endpoint,
        "OIDC_OP_LOGOUT_ENDPOINT": end_session_endpoint,
        "OIDC_RP_SIGN_ALGO": sign_algo,
        "OIDC_RP_SCOPES": scopes,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_USE_NONCE": True,
        "OIDC_VERIFY_SSL": verify_ssl,
        "OIDC_TIMEOUT": timeout,
        "OIDC_CLOCK_SKEW_SECONDS": clock_skew_seconds,
        "OIDC_DISCOVERY_CACHE_SECONDS": discovery_cache_seconds,
        "OIDC_JWKS_CACHE_SECONDS": jwks_cache_seconds,
        "OIDC_LOGOUT_AT_PROVIDER": logout_at_provider,
        "OIDC_TOKEN_AUTH_METHOD": token_auth_method,
        # The access token is never kept. The ID token is kept in the server-side session
        # only as the id_token_hint of RP-initiated logout (OpenID RP-Initiated Logout 1.0).
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_STORE_ID_TOKEN": logout_at_provider,
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


SAML_NAMEID_FORMATS = {
    "persistent": "urn:oasis:names:tc:SAML:2.0:nameid-format:persistent",
    "email": "urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress",
    "unspecified": "urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified",
}


def saml_settings(
    *,
    enabled: bool,
    base_url: str = "",
    sp_entity_id: str = "",
    idp_metadata_url: str = "",
    idp_metadata_file: str = "",
    sp_key_file: str = "",
    sp_cert_file: str = "",
    want_response_signed: bool = False,
    nameid_format: str = "persistent",
    clock_skew_seconds: int = 60,
    attr_username: str = "uid",
    attr_email: str = "mail",
    attr_first_name: str = "givenName",
    attr_last_name: str = "sn",
    attr_groups: str = "groups",
    create_user: bool = True,
    metadata_cache_seconds: int = 3600,
    timeout: int = 10,
    xmlsec_binary: str = "xmlsec1",
) -> dict[str, Any]:
    """SAML 2.0 service provider settings (djangosaml2 on pysaml2).

    Plain values only: the pysaml2 configuration itself is built per request by
    tenants/sso/saml.py (it needs the IdP metadata, which is fetched and cached).
    """
    from pathlib import Path

    if enabled:
        missing = [n for n, v in {"SAML_BASE_URL": base_url, "SAML_SP_KEY_FILE": sp_key_file,
                                  "SAML_SP_CERT_FILE": sp_cert_file}.items() if not v]
        if not (idp_metadata_url or idp_metadata_file):
            missing.append("SAML_IDP_METADATA_URL (or SAML_IDP_METADATA_FILE)")
        if missing:
            raise AuthConfigError(f"SAML_ENABLED is true but {', '.join(missing)} is not set")
        if idp_metadata_url and idp_metadata_file:
            raise AuthConfigError("Set SAML_IDP_METADATA_URL or SAML_IDP_METADATA_FILE, not both")
        if not base_url.startswith(("https://", "http://")):
            raise AuthConfigError("SAML_BASE_URL must be Camp's external URL (https://…)")
        for name, path in {"SAML_SP_KEY_FILE": sp_key_file, "SAML_SP_CERT_FILE": sp_cert_file,
                           "SAML_IDP_METADATA_FILE": idp_metadata_file}.items():
            if path and not Path(path).is_file():
                raise AuthConfigError(f"{name}={path} is not a readable file")
        if nameid_format and nameid_format not in SAML_NAMEID_FORMATS:
            raise AuthConfigError(
                f"SAML_NAMEID_FORMAT must be one of {', '.join(SAML_NAMEID_FORMATS)} or empty")
        if not 0 <= clock_skew_seconds <= 300:
            raise AuthConfigError("SAML_CLOCK_SKEW_SECONDS must be between 0 and 300")
    base = base_url.rstrip("/")
    return {
        "SAML_ENABLED": enabled,
        "SAML_BASE_URL": base,
        "SAML_SP_ENTITY_ID": sp_entity_id or f"{base}/saml/metadata/",
        "SAML_IDP_METADATA_URL": idp_metadata_url,
        "SAML_IDP_METADATA_FILE": idp_metadata_file,
        "SAML_SP_KEY_FILE": sp_key_file,
        "SAML_SP_CERT_FILE": sp_cert_file,
        "SAML_WANT_RESPONSE_SIGNED": want_response_signed,
        "SAML_NAMEID_FORMAT": SAML_NAMEID_FORMATS.get(nameid_format, ""),
        "SAML_CLOCK_SKEW_SECONDS": clock_skew_seconds,
        "SAML_ATTRIBUTES": {"username": attr_username, "email": attr_email,
                            "first_name": attr_first_name, "last_name": attr_last_name,
                            "groups": attr_groups},
        "SAML_CREATE_USER": create_user,
        "SAML_METADATA_CACHE_SECONDS": metadata_cache_seconds,
        "SAML_TIMEOUT": timeout,
        "SAML_XMLSEC_BINARY": xmlsec_binary,
        # djangosaml2: build the pysaml2 config per request from the settings above.
        "SAML_CONFIG_LOADER": "tenants.sso.saml.sp_config",
        "SAML_DEFAULT_BINDING": "urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect",
        "SAML_SESSION_COOKIE_NAME": "camp_saml_session",
        # The IdP's LogoutResponse may say the IdP session was already gone: Camp's ended anyway.
        "SAML_IGNORE_LOGOUT_ERRORS": True,
        "SAML_CSP_HANDLER": "",
    }
