"""Start-up checks for single sign-on: a switched-on integration must be able to work.

Run by ``manage.py check`` (and so by ``migrate`` and the container's start-up), so a
missing package or binary is named before anyone tries to log in.
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register


@register(Tags.security)
def saml_requirements(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if not getattr(settings, "SAML_ENABLED", False):
        return []
    errors: list[CheckMessage] = []
    for module, package in (("saml2", "pysaml2"), ("djangosaml2", "djangosaml2")):
        if importlib.util.find_spec(module) is None:
            errors.append(Error(
                f"SAML_ENABLED is true but the Python package {package} is not installed.",
                hint="pip install -r requirements.txt", id="camp.E101"))
    binary = getattr(settings, "SAML_XMLSEC_BINARY", "xmlsec1")
    if shutil.which(binary) is None:
        errors.append(Error(
            f"SAML_ENABLED is true but {binary} (SAML_XMLSEC_BINARY) is not on the PATH; "
            "pysaml2 needs it to check signatures.",
            hint="Install the Debian package xmlsec1 (apt-get install xmlsec1).",
            id="camp.E102"))
    return errors


@register(Tags.security, deploy=True)
def sso_urls_use_https(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Provider metadata fetched over plain HTTP could be swapped for an attacker's keys."""
    warnings: list[CheckMessage] = []
    checks = {
        "SAML_IDP_METADATA_URL": getattr(settings, "SAML_ENABLED", False),
        "OIDC_ISSUER": getattr(settings, "OIDC_ENABLED", False),
    }
    for name, enabled in checks.items():
        value = str(getattr(settings, name, "") or "")
        if enabled and value.startswith("http://"):
            warnings.append(Warning(
                f"{name} is a plain http:// URL: the provider's signing keys fetched from it "
                "could be replaced in transit.", hint="Use the provider's https:// URL.",
                id="camp.W103"))
    return warnings
