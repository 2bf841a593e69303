"""SAML 2.0 sign-in through a real pysaml2 identity provider process, in real Chromium."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client

from tenants.models import AuditEvent, Membership, User
from tenants.sso.saml import CLASH_MESSAGE, UNVERIFIED_MESSAGE

from .conftest import BrowserThread, configure, make_acme
from .servers import SamlIdentityProvider

pytestmark = pytest.mark.django_db(transaction=True)

GROUPS = "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups"


def saml_login(page: Any, base: str, username: str, password: str) -> tuple[str, str, bool]:
    """Click the SAML button; sign in at the IdP if it asks. Returns (url, page, asked)."""
    page.goto(f"{base}/login/")
    page.click("#saml-login")
    page.wait_for_load_state()
    asked = page.locator("#idp-password").count() > 0
    if asked:
        page.fill("#idp-username", username)
        page.fill("#idp-password", password)
        page.click("#idp-submit")
    try:
        page.wait_for_url(lambda url: url.startswith(base) and "/saml/" not in url,
                          timeout=20000)
    except Exception as exc:
        raise AssertionError(f"never came back to Camp; at {page.url}:\n{page.content()[:2000]}") from exc
    page.wait_for_load_state()
    return page.url, page.content(), asked


def roles_of(user: User) -> set[str]:
    return {f"{m.role}:{m.project or m.tenant.name}" for m in Membership.objects.filter(user=user)}


@pytest.fixture
def saml_on(settings: Any, saml_idp: SamlIdentityProvider, live_server: Any) -> str:
    base = str(live_server.url).replace("localhost", "127.0.0.1")
    configure(settings, saml=saml_idp.camp_settings(base))
    settings.SAML_PROVIDER_NAME = "Test SAML IdP"
    make_acme()
    metadata = Client().get("/saml/metadata/")
    assert metadata.status_code == 200
    saml_idp.write(sp_metadata=metadata.content.decode(), sign_assertion=True,
                   sign_response=False)
    return base


def test_sp_metadata_is_published_at_a_stable_url(saml_on: str) -> None:
    xml = Client().get("/saml/metadata/").content.decode()
    assert f'entityID="{saml_on}/saml/metadata/"' in xml
    assert f'Location="{saml_on}/saml/acs/"' in xml
    assert 'WantAssertionsSigned="true"' in xml and 'AuthnRequestsSigned="true"' in xml
    assert "X509Certificate" in xml and f'Location="{saml_on}/saml/ls/"' in xml
    # Only the SHA-2 algorithms are advertised (issue 31, item 6), not pysaml2's defaults.
    assert "xmldsig-more#rsa-sha256" in xml and "xmlenc#sha256" in xml
    for weak in ("md5", "#sha1", "rsa-sha1", "dsa-sha1", "ripemd160", "sha224"):
        assert weak not in xml, weak


def test_saml_login_maps_groups_single_logout_and_resync(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    base = saml_on
    # A local account with the same e-mail (and another IdP's account) must not be taken over.
    User.objects.create(username="grace-local", email="grace@example.test")
    saml_idp.add_user("grace", "grace-idp-pw", name_id="grace-persistent-0001", attributes={
        "uid": ["grace"], "mail": ["grace@example.test"], "givenName": ["Grace"],
        "sn": ["Hopper"], GROUPS: ["acme-owners", "acme-ml"]})
    page = browser.new_page()

    url, html, asked = browser.run(saml_login, page, base, "grace", "grace-idp-pw")
    assert asked and "/login/" not in url and "Log out" in html, html[:1500]
    grace = User.objects.get(auth_source="saml")
    assert (grace.username, grace.email, grace.first_name, grace.last_name) == (
        "grace", "grace@example.test", "Grace", "Hopper")
    assert (grace.sso_issuer, grace.sso_subject) == (saml_idp.entity_id, "grace-persistent-0001")
    assert roles_of(grace) == {"tenant_owner:acme", "project_member:acme/ml"}
    assert User.objects.filter(email="grace@example.test").count() == 2
    assert AuditEvent.objects.filter(action="auth.login", actor=grace).exists()
    assert AuditEvent.objects.filter(action="membership.created", actor_username="sso:saml").count() == 2

    # Single logout: Camp's logout sends a LogoutRequest; the IdP ends its session and
    # answers; the browser lands on Camp's login page with no session left.
    slo_before = saml_idp.hits("slo:request_ok")

    def logout() -> str:
        page.click("form.logout button")
        page.wait_for_url(f"{base}/login/**")
        page.goto(f"{base}/")
        return str(page.url)

    assert "/login/" in browser.run(logout)
    assert saml_idp.hits("slo:request_ok") == slo_before + 1
    assert AuditEvent.objects.filter(action="auth.logout", actor=grace).exists()

    # The groups change at the IdP. Logging in again asks for the password (the IdP session
    # ended with the single logout) and re-syncs the roles on the same account.
    saml_idp.control["users"]["grace"]["attributes"][GROUPS] = ["acme-ml-leads"]
    saml_idp.write()
    url, html, asked = browser.run(saml_login, page, base, "grace", "grace-idp-pw")
    assert asked and "Log out" in html
    assert User.objects.filter(auth_source="saml").count() == 1
    assert roles_of(grace) == {"project_admin:acme/ml"}
    removed = AuditEvent.objects.get(action="membership.deleted", actor_username="sso:saml")
    assert removed.before["role"] == "tenant_owner"


@pytest.mark.parametrize("sign_response", [False, True], ids=["nothing-signed", "only-response-signed"])
def test_an_unsigned_assertion_is_refused(
        sign_response: bool, saml_on: str, saml_idp: SamlIdentityProvider,
        browser: BrowserThread) -> None:
    saml_idp.add_user("mallory", "mallory-pw", name_id="mallory-0001", attributes={
        "uid": ["mallory"], GROUPS: ["camp-admins"]})
    saml_idp.write(sign_assertion=False, sign_response=sign_response)
    errors: list[int] = []

    def run(page: Any) -> tuple[str, str, bool]:
        page.on("response", lambda r: errors.append(r.status) if (
            r.url.startswith(saml_on) and r.status >= 500) else None)
        return saml_login(page, saml_on, "mallory", "mallory-pw")

    url, html, _ = browser.run(run, browser.new_page())
    assert url.startswith(f"{saml_on}/login/") and UNVERIFIED_MESSAGE in html.replace("&#x27;", "'")
    assert errors == []
    assert not User.objects.filter(username="mallory").exists()
    refused = AuditEvent.objects.get(action="auth.login_refused")
    assert refused.after["source"] == "saml"
    assert refused.after["reason"].startswith("assertion signature missing or invalid")


def test_idp_initiated_single_logout_ends_the_camp_session(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    saml_idp.add_user("ivan", "ivan-pw", name_id="ivan-0001", attributes={"uid": ["ivan"]})
    page = browser.new_page()
    _, html, _ = browser.run(saml_login, page, saml_on, "ivan", "ivan-pw")
    assert "Log out" in html

    def logout_at_idp() -> tuple[str, str]:
        page.goto(f"{saml_idp.base}/slo/initiate")
        page.wait_for_selector("#idp-signed-out")
        page.goto(f"{saml_on}/")
        return str(page.url), page.content()

    url, _ = browser.run(logout_at_idp)
    assert "/login/" in url
    assert saml_idp.hits("slo:response_ok") >= 1
    assert AuditEvent.objects.filter(action="auth.logout", actor__username="ivan").exists()


def test_username_clash_is_refused_with_a_message(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    User.objects.create(username="heidi", auth_source="oidc", sso_issuer="x", sso_subject="y")
    saml_idp.add_user("heidi", "heidi-pw", name_id="heidi-0001", attributes={
        "uid": ["heidi"], GROUPS: ["camp-admins"]})
    url, html, _ = browser.run(saml_login, browser.new_page(), saml_on, "heidi", "heidi-pw")
    assert "/login/" in url and CLASH_MESSAGE.format(username="heidi") in html
    assert not User.objects.filter(auth_source="saml").exists()
    assert not User.objects.get(username="heidi").is_platform_admin


def test_missing_xmlsec1_is_reported_at_start_up(settings: Any) -> None:
    settings.SAML_ENABLED = True
    settings.SAML_XMLSEC_BINARY = "xmlsec1-not-installed"
    with pytest.raises(SystemCheckError, match="apt-get install xmlsec1"):
        call_command("check")


def test_unreachable_idp_metadata_shows_the_login_page(
        settings: Any, saml_on: str, saml_idp: SamlIdentityProvider) -> None:
    from tenants.sso.saml import UNREACHABLE_MESSAGE

    from .servers import free_port

    configure(settings, saml=saml_idp.camp_settings(
        saml_on, idp_metadata_url=f"http://127.0.0.1:{free_port()}/metadata"))
    client = Client()
    response = client.get("/saml/login/", follow=True)
    assert response.redirect_chain[-1][0] == "/login/"
    assert UNREACHABLE_MESSAGE in response.content.decode().replace("&#x27;", "'")
    refused = AuditEvent.objects.get(action="auth.login_refused")
    assert refused.after["reason"].startswith("SAML_IDP_METADATA_URL could not be fetched")


def test_attribute_names_match_as_the_idp_or_pysaml2_names_them() -> None:
    from tenants.sso.saml import _values

    # pysaml2 renames ADFS claim URIs and OIDs it knows; unknown URIs keep their name.
    ava = {"emailAddress": ["ada@example.test"], "group": ["acme-ml"],
           "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups": ["g-1"],
           "Mail": ["other@example.test"]}
    assert _values(ava, "http://schemas.xmlsoap.org/ws/2005/05/identity/claims/emailaddress") == [
        "ada@example.test"]
    assert _values(ava, "http://schemas.xmlsoap.org/claims/Group") == ["acme-ml"]
    assert _values(ava, "http://schemas.microsoft.com/ws/2008/06/identity/claims/groups") == ["g-1"]
    assert _values(ava, "mail") == ["other@example.test"] and _values(ava, "sn") == []


def test_logout_without_the_saml_cookie_still_ends_the_camp_session(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    saml_idp.add_user("judy", "judy-pw", name_id="judy-0001", attributes={"uid": ["judy"]})
    page = browser.new_page()
    _, html, _ = browser.run(saml_login, page, saml_on, "judy", "judy-pw")
    assert "Log out" in html

    def logout() -> tuple[str, str]:
        cookies = [c for c in page.context.cookies() if c["name"] != "camp_saml_session"]
        page.context.clear_cookies()
        page.context.add_cookies(cookies)
        page.click("form.logout button")
        page.wait_for_url(f"{saml_on}/login/**")
        page.goto(f"{saml_on}/")
        return str(page.url), page.content()

    url, _ = browser.run(logout)
    assert "/login/" in url
    assert AuditEvent.objects.filter(action="auth.logout", actor__username="judy").exists()


def test_a_replayed_assertion_is_refused(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    from urllib.parse import parse_qs

    saml_idp.add_user("kim", "kim-pw", name_id="kim-0001", attributes={"uid": ["kim"]})
    page = browser.new_page()
    posted: list[str] = []
    browser.run(lambda: page.on("request", lambda r: posted.append(r.post_data or "") if (
        r.method == "POST" and r.url.startswith(f"{saml_on}/saml/acs/")) else None))
    _, html, _ = browser.run(saml_login, page, saml_on, "kim", "kim-pw")
    assert "Log out" in html and len(posted) == 1
    form = {k: v[0] for k, v in parse_qs(posted[0]).items()}

    # The same signed response, posted again from elsewhere, answers no request of that
    # session: refused on the login page, audited, nobody signed in.
    thief = Client()
    response = thief.post("/saml/acs/", form, follow=True)
    assert response.redirect_chain[-1][0] == "/login/" and "_auth_user_id" not in thief.session
    refused = AuditEvent.objects.get(action="auth.login_refused")
    assert refused.after["reason"].startswith("response to no request of this session")


def test_an_expired_assertion_is_refused(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    saml_idp.add_user("olga", "olga-pw", name_id="olga-0001", attributes={"uid": ["olga"]})
    saml_idp.write(lifetime_minutes=-10)  # NotOnOrAfter 10 minutes ago, beyond the leeway
    try:
        url, html, _ = browser.run(saml_login, browser.new_page(), saml_on, "olga", "olga-pw")
    finally:
        saml_idp.control.pop("lifetime_minutes")
        saml_idp.write()
    assert url.startswith(f"{saml_on}/login/") and UNVERIFIED_MESSAGE in html.replace("&#x27;", "'")
    assert not User.objects.filter(username="olga").exists()
    reason = AuditEvent.objects.get(action="auth.login_refused").after["reason"]
    assert reason.startswith("assertion conditions not met: validity period"), reason


def test_a_wrong_audience_is_refused_and_audited_by_name(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    saml_idp.add_user("wendy", "wendy-pw", name_id="wendy-0001", attributes={"uid": ["wendy"]})
    saml_idp.write(audience="https://other-sp.example.test/metadata")
    try:
        url, html, _ = browser.run(saml_login, browser.new_page(), saml_on, "wendy", "wendy-pw")
    finally:
        saml_idp.control.pop("audience")
        saml_idp.write()
    assert url.startswith(f"{saml_on}/login/") and UNVERIFIED_MESSAGE in html.replace("&#x27;", "'")
    assert not User.objects.filter(username="wendy").exists()
    reason = AuditEvent.objects.get(action="auth.login_refused").after["reason"]
    assert reason == "assertion audience is not Camp's entity id (AudienceRestriction)", reason


def test_an_unsigned_logout_request_does_not_end_the_camp_session(
        saml_on: str, saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    saml_idp.add_user("lena", "lena-pw", name_id="lena-0001", attributes={"uid": ["lena"]})
    page = browser.new_page()
    _, html, _ = browser.run(saml_login, page, saml_on, "lena", "lena-pw")
    assert "Log out" in html

    def forged_logout() -> tuple[int, str]:
        response = page.goto(f"{saml_idp.base}/slo/initiate?unsigned=1")
        status = response.status
        page.goto(f"{saml_on}/")
        return status, page.content()

    status, html = browser.run(forged_logout)
    assert status == 403 and "Log out" in html  # still signed in
    refused = AuditEvent.objects.get(action="auth.logout_refused")
    assert refused.after == {"source": "saml", "reason": "LogoutRequest not signed by the IdP"}


@pytest.mark.parametrize(("sign_alg", "digest_alg", "named"), [
    ("http://www.w3.org/2000/09/xmldsig#rsa-sha1", "http://www.w3.org/2000/09/xmldsig#sha1",
     "rsa-sha1"),
    ("http://www.w3.org/2001/04/xmldsig-more#rsa-sha256", "http://www.w3.org/2000/09/xmldsig#sha1",
     "a sha1 digest"),
], ids=["rsa-sha1", "sha1-digest"])
def test_a_sha1_signed_response_is_refused_by_name(
        sign_alg: str, digest_alg: str, named: str, saml_on: str,
        saml_idp: SamlIdentityProvider, browser: BrowserThread) -> None:
    # Validly signed by the IdP's own key: only the algorithm is wrong (issue 31, item 6).
    saml_idp.add_user("sid", "sid-pw", name_id="sid-0001", attributes={
        "uid": ["sid"], GROUPS: ["acme-ml"]})
    saml_idp.write(sign_assertion=True, sign_response=True, sign_alg=sign_alg,
                   digest_alg=digest_alg)
    try:
        url, html, _ = browser.run(saml_login, browser.new_page(), saml_on, "sid", "sid-pw")
    finally:
        saml_idp.write(sign_response=False, sign_alg=None, digest_alg=None)
    assert url.startswith(f"{saml_on}/login/") and UNVERIFIED_MESSAGE in html.replace("&#x27;", "'")
    assert not User.objects.filter(username="sid").exists()
    refused = AuditEvent.objects.get(action="auth.login_refused")
    assert refused.after["reason"].startswith(f"signature uses {named}, which Camp does not accept")
    # The same user with SHA-256 (pysaml2's default) signs in.
    url, html, _ = browser.run(saml_login, browser.new_page(), saml_on, "sid", "sid-pw")
    assert "Log out" in html and User.objects.filter(username="sid").exists()
