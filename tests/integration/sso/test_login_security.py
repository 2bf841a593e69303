"""What every login path shares: the login page, throttling, sessions, API tokens, settings."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
from django.test import Client

from tenants import services
from tenants.models import AuditEvent, User
from tenants.sso.config import oidc_settings
from tenants.sso.mapping import Grant, MappingError, parse_group_roles

from .conftest import Acme, configure, ldap_config
from .servers import REPO, Slapd

PASSWORD = "local-password-123"
DUMMY_OIDC = oidc_settings(
    enabled=True, issuer="https://idp.example.test/realms/camp", client_id="camp",
    client_secret="s3cret", authorization_endpoint="https://idp.example.test/auth",
    token_endpoint="https://idp.example.test/token", userinfo_endpoint="",
    jwks_endpoint="https://idp.example.test/certs",
)


def local_user(username: str = "lena") -> User:
    user = User.objects.create(username=username, email=f"{username}@example.test")
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.mark.django_db
def test_login_page_shows_what_is_configured(settings: Any) -> None:
    configure(settings)  # local only
    page = Client().get("/login/").content.decode()
    assert 'id="password-login"' in page and "oidc-login" not in page
    assert Client().get("/oidc/authenticate/").status_code == 404

    configure(settings, oidc=DUMMY_OIDC)  # local + OIDC
    page = Client().get("/login/?next=/tokens/").content.decode()
    assert 'id="password-login"' in page and "Log in with Test IdP" in page
    redirect = Client().get("/oidc/authenticate/")
    assert redirect.status_code == 302
    target = redirect["Location"]
    assert target.startswith("https://idp.example.test/auth?")
    for param in ("code_challenge_method=S256", "code_challenge=", "state=", "nonce=",
                  "response_type=code", "client_id=camp"):
        assert param in target


@pytest.mark.django_db
def test_local_login_can_be_switched_off(settings: Any) -> None:
    local_user()
    configure(settings, local=False, oidc=DUMMY_OIDC)
    page = Client().get("/login/").content.decode()
    assert "Log in with Test IdP" in page and 'id="password-login"' not in page
    client = Client()
    response = client.post("/login/", {"username": "lena", "password": PASSWORD})
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert "Password login is switched off" in response.content.decode()


@pytest.mark.django_db
def test_local_off_with_ldap_on_keeps_the_form_for_directory_accounts(
        settings: Any, slapd: Slapd, acme: Acme) -> None:
    local_user()
    configure(settings, local=False, ldap=ldap_config(slapd))
    assert "Use your directory (LDAP) username" in Client().get("/login/").content.decode()
    assert Client().post("/login/", {"username": "lena", "password": PASSWORD}).status_code == 200
    assert Client().post("/login/", {"username": "alice", "password": "alice-ldap-pw"}).status_code == 302


@pytest.mark.django_db
def test_throttling_locks_an_account_from_an_address_for_local_and_ldap_logins(
        settings: Any, slapd: Slapd, acme: Acme) -> None:
    configure(settings, ldap=ldap_config(slapd))
    settings.AXES_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 6
    attacker = "10.0.0.66"
    for _ in range(5):  # an attacker guesses alice's password from one address
        Client(REMOTE_ADDR=attacker).post("/login/", {"username": "alice", "password": "guess"})
    locked = Client(REMOTE_ADDR=attacker).post(
        "/login/", {"username": "alice", "password": "alice-ldap-pw"})
    assert locked.status_code == 429 and b"Too many failed logins" in locked.content
    assert not User.objects.filter(username="alice").exists()  # the right password did not help
    # ... but cannot lock alice out: from her own address she signs in (LDAP)
    assert Client(REMOTE_ADDR="10.0.0.4").post(
        "/login/", {"username": "alice", "password": "alice-ldap-pw"}).status_code == 302
    # the failures before the limit are audited one by one, the third as the lockout, once
    # for all five tries
    assert AuditEvent.objects.filter(action="auth.login_failed", actor_username="alice").count() == 2
    lockouts = AuditEvent.objects.filter(action="auth.locked_out")
    assert [(e.actor_username, e.after) for e in lockouts] == [
        ("alice", {"ip_address": attacker, "scope": "account+address"})]

    # spraying many names from one address locks that address (at its own, higher limit) ...
    local_user()
    sprayer = "10.9.9.9"
    for i in range(8):
        Client(REMOTE_ADDR=sprayer).post("/login/", {"username": f"x{i}", "password": "guess"})
    locked = Client(REMOTE_ADDR=sprayer).post("/login/", {"username": "lena", "password": PASSWORD})
    assert locked.status_code == 429
    # ... audited once for the address, however many names it tries
    assert AuditEvent.objects.filter(action="auth.locked_out", after__scope="address").count() == 1
    # ... and no one else: lena from another address, and single sign-on refusals there
    # (no username) count per address only
    assert Client(REMOTE_ADDR="10.9.9.8").post(
        "/login/", {"username": "lena", "password": PASSWORD}).status_code == 302


@pytest.mark.django_db
def test_login_cycles_the_session_and_logout_ends_it(settings: Any) -> None:
    configure(settings)
    user = local_user()
    client = Client()
    session = client.session
    session["planted"] = "by an attacker"
    session.save()
    client.cookies[settings.SESSION_COOKIE_NAME] = session.session_key
    before = session.session_key
    assert client.post("/login/", {"username": "lena", "password": PASSWORD}).status_code == 302
    after = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert after != before  # session fixation: the pre-login key is worthless
    assert Client(HTTP_COOKIE=f"{settings.SESSION_COOKIE_NAME}={before}").get("/").status_code == 302

    assert client.post("/logout/").status_code == 302
    replay = Client()
    replay.cookies[settings.SESSION_COOKIE_NAME] = after
    assert replay.get("/")["Location"].startswith("/login/")
    assert AuditEvent.objects.filter(action="auth.logout", actor=user).exists()


@pytest.mark.django_db
def test_api_tokens_work_whatever_the_login_methods(settings: Any, acme: Acme) -> None:
    user = local_user()
    _, plaintext = services.token_create(actor=user, name="ci")
    configure(settings, local=False, oidc=DUMMY_OIDC)
    response = Client().get("/api/v1/tenants/", HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert response.status_code == 200


def test_group_role_mapping_parses_and_rejects() -> None:
    mapping = parse_group_roles('{"Admins": "platform_admin", "ml": ["project_admin:acme/ml", '
                                '"tenant_owner:acme"]}')
    assert mapping.grants_for(["admins", "other"]) == {Grant("platform_admin")}
    assert {g.key for g in mapping.grants_for(["ML"])} == {"project_admin:acme/ml", "tenant_owner:acme"}
    for bad in ('{"g": "tenant_owner"}', '{"g": "project_member:acme"}', '{"g": "root"}', "[1]", "{"):
        with pytest.raises(MappingError, match="SSO_GROUP_ROLES"):
            parse_group_roles(bad)


def _settings_from_env(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = ("import django; from django.conf import settings; django.setup(); "
            "print(settings.AUTHENTICATION_BACKENDS); print(settings.AUTH_LDAP_SERVER_URI); "
            "print(settings.AUTH_LDAP_USER_SEARCH.filterstr, settings.AUTH_LDAP_BIND_PASSWORD); "
            "print(settings.OIDC_OP_TOKEN_ENDPOINT, settings.OIDC_USE_PKCE); "
            "print(len(settings.SSO_GROUP_ROLES.entries))")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LDAP_", "OIDC_", "SSO_"))}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={**base, "DJANGO_SETTINGS_MODULE": "camp.settings", **env}, timeout=60)


def test_settings_come_from_the_environment(tmp_path: Any) -> None:
    secret = tmp_path / "bind-password"
    secret.write_text("from-a-file\n")
    done = _settings_from_env({
        "LOCAL_LOGIN_ENABLED": "false", "LDAP_ENABLED": "true", "OIDC_ENABLED": "true",
        "LDAP_SERVER_URI": "ldaps://dc1.corp.example:636", "LDAP_BIND_DN": "CN=svc,DC=corp",
        "LDAP_BIND_PASSWORD_FILE": str(secret), "LDAP_USER_SEARCH_BASE": "DC=corp",
        "LDAP_USER_FILTER": "(sAMAccountName=%(user)s)", "LDAP_GROUP_TYPE": "memberOf",
        "OIDC_ISSUER": "https://kc/realms/camp", "OIDC_CLIENT_ID": "camp",
        "OIDC_CLIENT_SECRET": "x", "OIDC_AUTHORIZATION_ENDPOINT": "https://kc/auth",
        "OIDC_TOKEN_ENDPOINT": "https://kc/token", "OIDC_JWKS_ENDPOINT": "https://kc/certs",
        "SSO_GROUP_ROLES": '{"camp-admins": "platform_admin"}',
    })
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == str(["axes.backends.AxesStandaloneBackend", "tenants.sso.ldap.CampLDAPBackend",
                            "tenants.sso.oidc.CampOIDCBackend"])
    assert lines[1:] == ["ldaps://dc1.corp.example:636", "(sAMAccountName=%(user)s) from-a-file",
                         "https://kc/token True", "1"]

    done = _settings_from_env({"OIDC_ENABLED": "true", "OIDC_ISSUER": "https://kc"})
    assert done.returncode != 0 and "OIDC_CLIENT_ID" in done.stderr
    done = _settings_from_env({"SSO_GROUP_ROLES": '{"g": "owner"}'})
    assert done.returncode != 0 and "SSO_GROUP_ROLES" in done.stderr
    done = _settings_from_env({"SAML_ENABLED": "true", "SAML_IDP_METADATA_URL": "https://idp/md"})
    assert done.returncode != 0 and "SAML_BASE_URL" in done.stderr and "SAML_SP_KEY_FILE" in done.stderr
    done = _settings_from_env({"OIDC_ENABLED": "true", "OIDC_ISSUER": "https://kc",
                               "OIDC_CLIENT_ID": "camp", "OIDC_CLIENT_SECRET": "x",
                               "OIDC_CLOCK_SKEW_SECONDS": "3600"})
    assert done.returncode != 0 and "OIDC_CLOCK_SKEW_SECONDS" in done.stderr


def test_saml_and_oidc_issuer_alone_are_enough_from_the_environment(tmp_path: Any) -> None:
    from .servers import self_signed

    key, cert = self_signed(tmp_path, "sp")
    code = ("import django; from django.conf import settings; django.setup(); "
            "print(settings.AUTHENTICATION_BACKENDS[-2:]); print(settings.SAML_SP_ENTITY_ID); "
            "print(settings.SAML_ATTRIBUTES['groups']); print(repr(settings.OIDC_OP_TOKEN_ENDPOINT))")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LDAP_", "OIDC_", "SSO_", "SAML_"))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=60, env={
                              **base, "DJANGO_SETTINGS_MODULE": "camp.settings",
                              "OIDC_ENABLED": "true", "OIDC_ISSUER": "https://kc/realms/camp",
                              "OIDC_CLIENT_ID": "camp", "OIDC_CLIENT_SECRET": "x",
                              "SAML_ENABLED": "true", "SAML_BASE_URL": "https://camp.example.com/",
                              "SAML_IDP_METADATA_URL": "https://idp.example.com/metadata",
                              "SAML_SP_KEY_FILE": str(key), "SAML_SP_CERT_FILE": str(cert),
                              "SAML_ATTR_GROUPS": "http://schemas.xmlsoap.org/claims/Group"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        str(["tenants.sso.oidc.CampOIDCBackend", "tenants.sso.saml.CampSAMLBackend"]),
        "https://camp.example.com/saml/metadata/", "http://schemas.xmlsoap.org/claims/Group", "''"]


def test_check_deploy_is_clean_with_sso_on_and_names_what_is_wrong(tmp_path: Any) -> None:
    from .servers import self_signed

    key, cert = self_signed(tmp_path, "sp")
    secret = tmp_path / "secret"
    secret.write_text("x" * 20 + "a-long-random-production-secret-key-0123456789")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LDAP_", "OIDC_", "SSO_", "SAML_", "SECRET_KEY"))}
    env.update({
        "DJANGO_SETTINGS_MODULE": "camp.settings.production", "SECRET_KEY_FILE": str(secret),
        "ALLOWED_HOSTS": "camp.example.com", "DATABASE_URL": "postgres://camp@db.example.com/camp",
        "OIDC_ENABLED": "true", "OIDC_ISSUER": "https://kc.example.com/realms/camp",
        "OIDC_CLIENT_ID": "camp", "OIDC_CLIENT_SECRET": "x",
        "SAML_ENABLED": "true", "SAML_BASE_URL": "https://camp.example.com",
        "SAML_IDP_METADATA_URL": "https://idp.example.com/metadata",
        "SAML_SP_KEY_FILE": str(key), "SAML_SP_CERT_FILE": str(cert)})

    def check(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level",
                               "WARNING"], cwd=REPO, env={**env, **extra}, capture_output=True,
                              text=True, timeout=120)

    done = check()
    assert done.returncode == 0, done.stdout + done.stderr
    done = check(SAML_IDP_METADATA_URL="http://idp.example.com/metadata")
    assert done.returncode != 0 and "camp.W103" in done.stderr and "SAML_IDP_METADATA_URL" in done.stderr
    done = check(SAML_XMLSEC_BINARY="xmlsec1-missing")
    assert done.returncode != 0 and "camp.E102" in done.stderr and "apt-get install xmlsec1" in done.stderr
