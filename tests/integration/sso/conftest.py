"""Fixtures for the SSO tests: real slapd, a real OpenID provider, real Chromium.

Servers are session-scoped, each in its own process group, stopped in ``finally``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from .servers import (
    CHROMIUM,
    HERE,
    LDAP_SUFFIX,
    EdgeProvider,
    IdentityProvider,
    SamlIdentityProvider,
    Slapd,
    require_binary,
)

T = TypeVar("T")

# The one mapping the tests use, for OIDC and LDAP alike.
GROUP_ROLES = """{
  "camp-admins": "platform_admin",
  "acme-owners": "tenant_owner:acme",
  "acme-ml-leads": "project_admin:acme/ml",
  "acme-ml": "project_member:acme/ml",
  "cn=acme-vision,ou=groups,dc=camp,dc=test": "project_member:acme/vision",
  "ghost-group": "tenant_owner:no-such-tenant"
}"""


@pytest.fixture(scope="session")
def slapd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slapd]:
    server = Slapd(tmp_path_factory.mktemp("slapd"))
    try:
        server.start()
        server.ldif((HERE / "data" / "directory.ldif").read_text())
        yield server
    finally:
        server.stop()


def ldap_config(slapd: Slapd, group_type: str = "groupOfNames") -> dict[str, Any]:
    from tenants.sso.config import ldap_settings

    return ldap_settings(
        enabled=True, server_uri=slapd.uri,
        bind_dn=f"cn=svc-camp,{LDAP_SUFFIX}", bind_password="svc-password",
        user_search_base=f"ou=people,{LDAP_SUFFIX}", user_filter="(uid=%(user)s)",
        group_type=group_type, group_search_base=f"ou=groups,{LDAP_SUFFIX}", timeout=5,
    )


def configure(settings: Any, *, local: bool = True, ldap: dict[str, Any] | None = None,
              oidc: dict[str, Any] | None = None, saml: dict[str, Any] | None = None) -> None:
    """Switch integrations on exactly as camp/settings/auth.py does from the environment."""
    from tenants.sso.config import authentication_backends
    from tenants.sso.mapping import parse_group_roles

    settings.LOCAL_LOGIN_ENABLED = local
    settings.LDAP_ENABLED = ldap is not None
    settings.OIDC_ENABLED = oidc is not None
    settings.SAML_ENABLED = saml is not None
    settings.AUTHENTICATION_BACKENDS = authentication_backends(
        local=local, ldap=ldap is not None, oidc=oidc is not None, saml=saml is not None)
    settings.SSO_GROUP_ROLES = parse_group_roles(GROUP_ROLES)
    for name, value in {**(ldap or {}), **(oidc or {}), **(saml or {})}.items():
        setattr(settings, name, value)
    settings.OIDC_PROVIDER_NAME = "Test IdP"


@dataclass
class Acme:
    admin: Any
    tenant: Any
    ml: Any
    vision: Any


def make_acme() -> Acme:
    from tenants import services
    from tenants.models import User

    admin = User.objects.create(username="root-admin", is_platform_admin=True)
    tenant = services.tenant_create(actor=admin, name="acme")
    ml = services.project_create(actor=admin, tenant=tenant, name="ml")
    vision = services.project_create(actor=admin, tenant=tenant, name="vision")
    return Acme(admin, tenant, ml, vision)


@pytest.fixture
def acme(db: Any) -> Acme:
    return make_acme()


@pytest.fixture(scope="session")
def idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityProvider]:
    provider = IdentityProvider(tmp_path_factory.mktemp("idp"))
    try:
        provider.start()
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="session")
def edge_provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProvider]:
    provider = EdgeProvider(tmp_path_factory.mktemp("edge-idp"))
    try:
        provider.start()
        yield provider
    finally:
        provider.stop()


@pytest.fixture(scope="session")
def saml_idp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SamlIdentityProvider]:
    provider = SamlIdentityProvider(tmp_path_factory.mktemp("saml-idp"))
    try:
        provider.start()
        yield provider
    finally:
        provider.stop()


class BrowserThread:
    """Chromium through Playwright's sync API, driven from one dedicated thread.

    Playwright's sync API keeps an asyncio loop running in the thread that uses it,
    which Django's ORM refuses to share; the test thread stays loop-free.
    """

    def __init__(self) -> None:
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.pw: Any = None
        self.browser: Any = None

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        return self.pool.submit(fn, *args).result(timeout=120)

    def start(self) -> None:
        def _start() -> None:
            from playwright.sync_api import sync_playwright

            self.pw = sync_playwright().start()
            self.browser = self.pw.chromium.launch(
                executable_path=CHROMIUM,
                args=["--headless", "--no-sandbox", "--disable-gpu",
                      "--disable-background-networking"],
            )
        self.run(_start)

    def new_page(self) -> Any:
        return self.run(lambda: self.browser.new_context().new_page())

    def stop(self) -> None:
        def _stop() -> None:
            if self.browser is not None:
                self.browser.close()
            if self.pw is not None:
                self.pw.stop()
        try:
            self.run(_stop)
        finally:
            self.pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def browser() -> Iterator[BrowserThread]:
    require_binary(CHROMIUM, "chromium")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("Python package playwright is missing: pip install -r requirements-dev.txt",
                    pytrace=False)
    thread = BrowserThread()
    try:
        thread.start()
        yield thread
    finally:
        thread.stop()




__all__ = ["Acme", "BrowserThread", "configure", "ldap_config", "make_acme"]
