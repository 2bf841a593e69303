"""SAML 2.0 service provider: djangosaml2 on pysaml2, matched by IdP entity id + NameID.

djangosaml2 does the protocol (AuthnRequest, signature and condition checks in pysaml2 with
Debian's xmlsec1, single logout); Camp adds what it does not: the pysaml2 configuration
built from plain settings with the IdP metadata fetched and cached, the account matching
and audited role re-sync shared with OIDC and LDAP, and failures that end on the login
page with a message instead of djangosaml2's bare error pages.

Imported only when SAML_ENABLED is on (the views, the backend), so a missing package is
reported by the system check (tenants/sso/checks.py), not by an import error.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import shutil
from typing import Any

import requests
import saml2
from django.conf import settings
from django.contrib import auth, messages
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseForbidden,
    HttpResponseRedirect,
)
from django.shortcuts import resolve_url
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from djangosaml2 import views as saml_views
from djangosaml2.backends import Saml2Backend
from saml2.config import SPConfig
from saml2.saml import NAMEID_FORMAT_TRANSIENT

from tenants.audit import audit_record
from tenants.models import User

from .services import (
    CONFUSABLE_MESSAGE,
    group_role_mapping,
    sso_login_refused,
    sso_new_username,
    sso_sync_memberships,
    sso_user_created,
)

logger = logging.getLogger(__name__)
# pysaml2 loads its XML schemas per configuration; xmlschema says so at INFO every time.
logging.getLogger("xmlschema").setLevel(logging.WARNING)
# djangosaml2's warnings print the assertion's attributes (personal data) into the log;
# Camp logs and audits each refusal itself, by reason.
logging.getLogger("djangosaml2").setLevel(logging.ERROR)

GENERIC_MESSAGE = "Single sign-on (SAML) did not complete. Try again or ask a platform admin."
UNVERIFIED_MESSAGE = (
    "The identity provider's answer could not be verified (it must be signed), so you were "
    "not signed in. A platform admin can find the reason in the audit log."
)
UNREACHABLE_MESSAGE = (
    "Camp could not load the identity provider's SAML metadata, so you were not signed in. "
    "Try again in a moment; if it keeps failing, tell a platform admin."
)
CLASH_MESSAGE = (
    "The username “{username}” is already taken by another Camp account, so no account "
    "was created for this sign-in. Ask a platform admin to resolve the clash."
)


def _setting(name: str) -> Any:
    # Read at call time (tests and settings overrides); set by camp/settings/auth.py.
    return getattr(settings, name)


class MetadataError(Exception):
    """The IdP metadata could not be loaded; the message names the setting."""


# --- configuration -----------------------------------------------------------------------

def idp_metadata(*, refresh: bool = False) -> str:
    """The IdP metadata XML: from SAML_IDP_METADATA_FILE, or the URL (cached)."""
    path = _setting("SAML_IDP_METADATA_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError as exc:
            raise MetadataError(f"SAML_IDP_METADATA_FILE={path} cannot be read") from exc
    url = _setting("SAML_IDP_METADATA_URL")
    key = f"camp:saml:idp-metadata:{hashlib.sha256(url.encode()).hexdigest()[:32]}"
    if not refresh:
        cached = cache.get(key)
        if isinstance(cached, str):
            return cached
    try:
        response = requests.get(url, timeout=_setting("SAML_TIMEOUT"))
        response.raise_for_status()
    except requests.RequestException as exc:
        raise MetadataError(
            f"SAML_IDP_METADATA_URL could not be fetched ({type(exc).__name__})") from exc
    text = response.text
    if "EntityDescriptor" not in text:
        raise MetadataError("SAML_IDP_METADATA_URL did not answer SAML metadata")
    cache.set(key, text, _setting("SAML_METADATA_CACHE_SECONDS"))
    return text


def forget_idp_metadata() -> None:
    """Drop the cached IdP metadata (the IdP may have rolled its signing certificate)."""
    url = _setting("SAML_IDP_METADATA_URL")
    if url:
        cache.delete(f"camp:saml:idp-metadata:{hashlib.sha256(url.encode()).hexdigest()[:32]}")


def sp_config_dict(metadata_xml: str) -> dict[str, Any]:
    """The pysaml2 SP configuration (see pysaml2's "Configuration of SAML2 entities")."""
    base = _setting("SAML_BASE_URL")
    sp: dict[str, Any] = {
        "name": "Camp",
        "endpoints": {
            "assertion_consumer_service": [(f"{base}/saml/acs/", saml2.BINDING_HTTP_POST)],
            "single_logout_service": [
                (f"{base}/saml/ls/", saml2.BINDING_HTTP_REDIRECT),
                (f"{base}/saml/ls/post/", saml2.BINDING_HTTP_POST),
            ],
        },
        # Signed assertions always; a signed response too if the IdP is set up for it.
        "want_assertions_signed": True,
        "want_response_signed": _setting("SAML_WANT_RESPONSE_SIGNED"),
        "authn_requests_signed": True,
        "logout_requests_signed": True,
        "logout_responses_signed": True,
        # Only answers to requests Camp made (InResponseTo): no IdP-initiated login.
        "allow_unsolicited": False,
        "name_id_format_allow_create": True,
    }
    if _setting("SAML_NAMEID_FORMAT"):
        sp["name_id_format"] = [_setting("SAML_NAMEID_FORMAT")]
        sp["name_id_policy_format"] = _setting("SAML_NAMEID_FORMAT")
    return {
        "entityid": _setting("SAML_SP_ENTITY_ID"),
        "xmlsec_binary": shutil.which(_setting("SAML_XMLSEC_BINARY")) or _setting("SAML_XMLSEC_BINARY"),
        "key_file": _setting("SAML_SP_KEY_FILE"),
        "cert_file": _setting("SAML_SP_CERT_FILE"),
        "encryption_keypairs": [{"key_file": _setting("SAML_SP_KEY_FILE"),
                                 "cert_file": _setting("SAML_SP_CERT_FILE")}],
        "metadata": {"inline": [metadata_xml]},
        "service": {"sp": sp},
        "accepted_time_diff": _setting("SAML_CLOCK_SKEW_SECONDS"),
        # Azure AD / ADFS name attributes by claim URI, which pysaml2 drops unless told.
        "allow_unknown_attributes": True,
        "signing_algorithm": "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
        "digest_algorithm": "http://www.w3.org/2001/04/xmlenc#sha256",
        "http_client_timeout": _setting("SAML_TIMEOUT"),
        "debug": False,
    }


def sp_config(request: HttpRequest | None = None) -> SPConfig:
    """djangosaml2's SAML_CONFIG_LOADER: a fresh pysaml2 config from the cached metadata."""
    conf = SPConfig()
    conf.load(sp_config_dict(idp_metadata()))
    return conf


# --- accounts ---------------------------------------------------------------------------

def _first(attributes: dict[str, list[Any]], name: str) -> str | None:
    values = _values(attributes, name)
    return values[0] if values else None


@functools.cache
def _pysaml2_local_names() -> dict[str, str]:
    """Attribute name → the short name pysaml2 gives it (its bundled ADFS/OID maps).

    pysaml2 renames attributes it knows (``…/claims/emailaddress`` → ``emailAddress``,
    ``urn:oid:0.9.2342.19200300.100.1.3`` → ``mail``); admins copy the names their IdP shows,
    so Camp accepts either.
    """
    from saml2.attribute_converter import ac_factory

    names: dict[str, str] = {}
    for converter in ac_factory():
        names.update(getattr(converter, "_fro", None) or {})  # no public accessor
    return names


def _values(attributes: dict[str, list[Any]], name: str) -> list[str]:
    if not name:
        return []
    wanted = {name.casefold()}
    local = _pysaml2_local_names().get(name.strip().lower())
    if local:
        wanted.add(local.casefold())
    # Attribute names from IdPs vary in case (mail / Mail).
    found = next((v for k, v in attributes.items() if k.casefold() in wanted), None)
    if found is None:
        return []
    return [str(v) for v in (found if isinstance(found, list | tuple) else [found])]


class CampSAMLBackend(Saml2Backend):
    """Find the account by (IdP entity id, NameID) — never by e-mail — or create it; re-sync.

    Replaces djangosaml2's lookup by username attribute, which would take over any
    account with that username.
    """

    def authenticate(self, request: HttpRequest | None, session_info: dict[str, Any] | None = None,
                     attribute_mapping: Any = None, create_unknown_user: bool = True,
                     assertion_info: Any = None, **kwargs: Any) -> User | None:
        if session_info is None or request is None:
            return None
        issuer = str(session_info.get("issuer") or "")
        name_id = session_info.get("name_id")
        attributes: dict[str, list[Any]] = session_info.get("ava") or {}
        names = _setting("SAML_ATTRIBUTES")
        hint = str(_first(attributes, names["username"]) or getattr(name_id, "text", "") or "")
        if name_id is None or not getattr(name_id, "text", None):
            return self._refuse(request, hint, "assertion has no NameID")
        if name_id.format == NAMEID_FORMAT_TRANSIENT:
            # A transient NameID changes at every login: it cannot identify an account.
            return self._refuse(request, hint, "NameID is transient; configure a persistent one")
        if len(str(name_id.text)) > 255 or len(issuer) > 255:  # the columns' size
            return self._refuse(request, hint, "NameID or IdP entity id longer than 255 characters")
        user, refusal = self._find_or_create(issuer, str(name_id.text), attributes)
        if refusal is not None:
            return self._refuse(request, *refusal)
        if user is not None and not user.is_active:
            return self._refuse(request, user.username, "account deactivated",
                                "This account is deactivated.")
        return user

    @staticmethod
    def _refuse(request: HttpRequest, username: str, reason: str,
                message: str = GENERIC_MESSAGE) -> None:
        sso_login_refused(request=request, source="saml", username=username, reason=reason,
                          message=message)
        return None

    @transaction.atomic
    def _find_or_create(self, issuer: str, subject: str, attributes: dict[str, list[Any]]
                        ) -> tuple[User | None, tuple[str, str, str] | None]:
        names = _setting("SAML_ATTRIBUTES")
        user = User.objects.select_for_update(no_key=True).filter(
            auth_source="saml", sso_issuer=issuer, sso_subject=subject).first()
        created = False
        if user is None:
            username, problem = sso_new_username(_first(attributes, names["username"]) or subject)
            if not _setting("SAML_CREATE_USER"):
                return None, (username, "no account for this identity and SAML_CREATE_USER is off",
                              "You have no Camp account yet. Ask a platform admin.")
            if problem == "confusable username":
                return None, (username, problem, CONFUSABLE_MESSAGE.format(username=username))
            if problem is not None:
                return None, (username, problem, CLASH_MESSAGE.format(username=username))
            user = User(username=username, auth_source="saml", sso_issuer=issuer,
                        sso_subject=subject)
            user.set_unusable_password()
            created = True
        for field in ("email", "first_name", "last_name"):
            value = _first(attributes, names[field])
            if value is not None:
                setattr(user, field, value[: 254 if field == "email" else 150])
        user.save()
        if created:
            sso_user_created(user=user, source="saml")
        groups = set(_values(attributes, names["groups"]))
        sso_sync_memberships(user=user, grants=group_role_mapping().grants_for(groups),
                             source="saml")
        return user, None


# --- views -----------------------------------------------------------------------------

def _back_to_login(request: HttpRequest, message: str) -> HttpResponse:
    messages.error(request, message)
    return HttpResponseRedirect(resolve_url(settings.LOGIN_URL))


def _failure_reason(exc: BaseException | None) -> tuple[str, str]:
    """(audited reason, message shown) for an exception from pysaml2 or djangosaml2."""
    from saml2.response import SignatureError, StatusError, UnsolicitedResponse, VerificationError
    from saml2.sigver import MissingKey
    from saml2.validate import ResponseLifetimeExceed, ToEarly

    name = type(exc).__name__ if exc is not None else "unknown"
    if isinstance(exc, MetadataError):
        return str(exc), UNREACHABLE_MESSAGE
    if isinstance(exc, SignatureError | MissingKey):
        return f"assertion signature missing or invalid ({name})", UNVERIFIED_MESSAGE
    if isinstance(exc, ResponseLifetimeExceed | ToEarly | VerificationError):
        # pysaml2's VerificationError is its "Condition not OK": validity times or audience.
        return f"assertion conditions not met: validity period or audience ({name})", \
            UNVERIFIED_MESSAGE
    if type(exc) is Exception and str(exc).startswith("AudienceRestrictions conditions not"):
        # pysaml2 raises a bare Exception for an assertion addressed to another SP.
        return ("assertion audience is not Camp's entity id (AudienceRestriction)",
                UNVERIFIED_MESSAGE)
    if isinstance(exc, UnsolicitedResponse):
        return "response to no request of this session (unsolicited or replayed)", GENERIC_MESSAGE
    if isinstance(exc, StatusError):
        return f"identity provider refused the login ({name})", GENERIC_MESSAGE
    return f"invalid SAML response ({name})", GENERIC_MESSAGE


class _SAMLEnabledMixin:
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not getattr(settings, "SAML_ENABLED", False):
            raise Http404("SAML is not enabled.")
        try:
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc, no-any-return]
        except MetadataError as exc:
            logger.warning("SAML: %s", exc)
            sso_login_refused(request=request, source="saml", username="", reason=str(exc),
                              message=UNREACHABLE_MESSAGE)
            return _back_to_login(request, UNREACHABLE_MESSAGE)


class SAMLLoginView(_SAMLEnabledMixin, saml_views.LoginView):
    """Redirect to the IdP with a signed AuthnRequest (djangosaml2)."""


# The IdP posts cross-site, so no CSRF token: the signed assertion answering a request id
# kept in this browser's SAML session is what protects the ACS (djangosaml2 does the same).
@method_decorator(csrf_exempt, name="dispatch")
class SAMLACSView(_SAMLEnabledMixin, saml_views.AssertionConsumerServiceView):
    """Receive the IdP's response; every failure is audited and shown on the login page."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        weak = weak_signature_algorithm(request.POST.get("SAMLResponse", ""))
        if weak is not None:
            reason = (f"signature uses {weak}, which Camp does not accept (SHA-256 or "
                      "stronger): set the identity provider's signing algorithm to RSA-SHA256")
            logger.warning("SAML response refused: %s", reason)
            sso_login_refused(request=request, source="saml", username="", reason=reason,
                              message=UNVERIFIED_MESSAGE)
            return _back_to_login(request, UNVERIFIED_MESSAGE)
        try:
            return super().post(request, *args, **kwargs)  # type: ignore[no-any-return]
        except MetadataError:
            raise
        except Exception as exc:  # noqa: BLE001 — pysaml2 raises many types; none may be a 500
            logger.warning("SAML response refused: %s", type(exc).__name__)
            return self.handle_acs_failure(request, exception=exc)

    def handle_acs_failure(self, request: HttpRequest, exception: BaseException | None = None,
                           status: int = 403, **kwargs: Any) -> HttpResponse:
        message = getattr(request, "camp_login_error", None)
        if message is None:  # not refused by the backend, so not audited yet
            if isinstance(exception, PermissionDenied):
                reason, message = "no account signed in", GENERIC_MESSAGE
            else:
                reason, message = _failure_reason(exception)
                if message == UNVERIFIED_MESSAGE:
                    forget_idp_metadata()  # refetched at the next attempt, new certificate and all
            sso_login_refused(request=request, source="saml", username="", reason=reason,
                              message=message)
        return _back_to_login(request, message)


class SAMLLogoutInitView(_SAMLEnabledMixin, saml_views.LogoutInitView):
    """Single logout started by Camp (called from the POST /logout/ view)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        local_only = HttpResponseRedirect(resolve_url(settings.LOGOUT_REDIRECT_URL))
        if saml_views._get_subject_id(request.saml_session) is None:  # type: ignore[attr-defined]
            # No SAML session in this browser (cookie lost): nothing to tell the IdP.
            auth.logout(request)
            return local_only
        try:
            response: HttpResponse = self.get(request, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 — logout must end the Camp session regardless
            logger.warning("SAML single logout failed: %s", type(exc).__name__)
            auth.logout(request)
            return local_only
        # djangosaml2 answers 4xx/5xx when the IdP knows no session; Camp's has ended.
        return local_only if response.status_code >= 400 else response

    def handle_unsupported_slo_exception(self, request: HttpRequest, exception: Exception,
                                         *args: Any, **kwargs: Any) -> HttpResponse:
        # The IdP offers no single logout: the Camp session is already ended.
        return HttpResponseRedirect(resolve_url(settings.LOGOUT_REDIRECT_URL))


@method_decorator(csrf_exempt, name="dispatch")
class SAMLLogoutServiceView(_SAMLEnabledMixin, saml_views.LogoutView):
    """The IdP's LogoutResponse to Camp's request, or its LogoutRequest (IdP-initiated).

    A LogoutRequest must be signed by the IdP: djangosaml2 does not ask pysaml2 to check
    the signature of one sent with the HTTP-Redirect binding, so any page could otherwise
    log a Camp user out by sending the browser to /saml/ls/.
    """

    def do_logout_service(self, request: HttpRequest, data: Any, binding: str, *args: Any,
                          **kwargs: Any) -> HttpResponse:
        if "SAMLRequest" in data and not self._signed_by_idp(request, data, binding):
            logger.warning("SAML: unsigned or badly signed LogoutRequest refused")
            audit_record(actor=None, actor_username="sso:saml", action="auth.logout_refused",
                         target_repr=str(getattr(request.user, "username", ""))[:255],
                         after={"source": "saml", "reason": "LogoutRequest not signed by the IdP"})
            return HttpResponseForbidden("The logout request is not signed by the identity "
                                         "provider; you are still logged in to Camp.")
        response: HttpResponse = super().do_logout_service(request, data, binding, *args, **kwargs)
        return response

    def _signed_by_idp(self, request: HttpRequest, data: Any, binding: str) -> bool:
        from saml2.sigver import verify_redirect_signature

        _, client = self.get_state_client(request)
        try:
            # With the POST binding pysaml2 checks an enveloped signature when there is one.
            parsed = client.parse_logout_request(data["SAMLRequest"], binding)
        except Exception:  # noqa: BLE001 — malformed or badly signed: not from the IdP
            return False
        if parsed is None or parsed.message is None or parsed.message.issuer is None:
            return False
        if binding == saml2.BINDING_HTTP_POST:
            return parsed.message.signature is not None
        if not (data.get("Signature") and data.get("SigAlg")):
            return False
        signed = {k: data[k] for k in ("SAMLRequest", "RelayState", "SigAlg", "Signature")
                  if k in data}
        certs = client.metadata.certs(parsed.message.issuer.text, "any", "signing")
        return any(verify_redirect_signature(signed, client.sec.sec_backend, cert)
                   for _, cert in certs)


class SAMLMetadataView(_SAMLEnabledMixin, saml_views.MetadataView):
    """Camp's SP metadata, at the stable URL /saml/metadata/ (also the default entity id)."""

    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        from saml2.metadata import entity_descriptor

        entity = entity_descriptor(self.get_sp_config(request))
        if entity.extensions is not None:
            # pysaml2 lists every algorithm the local xmlsec1 knows (md5, sha1, dsa-sha1,
            # ...); advertise only the SHA-2 ones Camp signs and digests with.
            entity.extensions.extension_elements = [
                e for e in entity.extensions.extension_elements
                if getattr(e, "tag", "") not in ("DigestMethod", "SigningMethod")
                or e.attributes.get("Algorithm") in ADVERTISED_ALGORITHMS
            ]
        return HttpResponse(content=str(entity).encode("utf-8"),
                            content_type="text/xml; charset=utf-8")


# Signature and digest algorithms refused in incoming responses (SHA-1 and MD5: collisions are
# practical; DSA-SHA1 likewise), named as the audit log says them.
WEAK_ALGORITHMS = {
    "http://www.w3.org/2000/09/xmldsig#rsa-sha1": "rsa-sha1",
    "http://www.w3.org/2000/09/xmldsig#dsa-sha1": "dsa-sha1",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha1": "ecdsa-sha1",
    "http://www.w3.org/2001/04/xmldsig-more#rsa-md5": "rsa-md5",
    "http://www.w3.org/2000/09/xmldsig#sha1": "a sha1 digest",
    "http://www.w3.org/2001/04/xmldsig-more#md5": "an md5 digest",
}
_DSIG = "{http://www.w3.org/2000/09/xmldsig#}"


def weak_signature_algorithm(saml_response: str) -> str | None:
    """The first SHA-1/MD5 signature or digest method in a POSTed ``SAMLResponse``, or None.

    pysaml2 verifies whatever algorithm xmlsec1 knows; Camp refuses the weak ones before it
    (response and assertion signatures alike). Undecodable input is left to pysaml2, which
    refuses it with its own reason."""
    import base64
    import binascii

    from defusedxml import ElementTree
    from defusedxml.common import DefusedXmlException

    try:
        root = ElementTree.fromstring(base64.b64decode(saml_response, validate=False))
    except (binascii.Error, ValueError, ElementTree.ParseError, DefusedXmlException):
        return None
    for tag in ("SignatureMethod", "DigestMethod"):
        for element in root.iter(f"{_DSIG}{tag}"):
            name = WEAK_ALGORITHMS.get(element.get("Algorithm", ""))
            if name is not None:
                return name
    return None


# SP metadata's alg:DigestMethod / alg:SigningMethod (SAML V2.0 Metadata Profile for
# Algorithm Support): SHA-2 only.
ADVERTISED_ALGORITHMS = frozenset({
    "http://www.w3.org/2001/04/xmlenc#sha256",
    "http://www.w3.org/2001/04/xmldsig-more#sha384",
    "http://www.w3.org/2001/04/xmlenc#sha512",
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256",
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha384",
    "http://www.w3.org/2001/04/xmldsig-more#rsa-sha512",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha256",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha384",
    "http://www.w3.org/2001/04/xmldsig-more#ecdsa-sha512",
})
