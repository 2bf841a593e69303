"""Cluster credentials, encrypted at rest with Fernet (AES-128-CBC + HMAC-SHA256).

Keys come from ``CAMP_ENCRYPTION_KEY`` (or ``CAMP_ENCRYPTION_KEY_FILE``): a
comma-separated list of Fernet keys, the first encrypts and all decrypt
(MultiFernet), so keys can be rotated. Without it the key is derived from
SECRET_KEY (HKDF-SHA256), which keeps the demo working with no set-up; production
deployments should set their own key so that rotating SECRET_KEY does not make
the stored credentials unreadable.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import yaml
from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

CREDENTIAL_FIELDS = ("kubeconfig", "token", "ca_cert")


def _derived_key() -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"camp-credentials", info=b"fernet")
    return base64.urlsafe_b64encode(hkdf.derive(settings.SECRET_KEY.encode()))


def _keys() -> list[bytes]:
    """The keys that decrypt, the encrypting one first."""
    keys = [k.encode() for k in getattr(settings, "CAMP_ENCRYPTION_KEYS", []) if k]
    return keys or [_derived_key()]


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(k) for k in _keys()])


def key_fingerprints() -> list[str]:
    """A short SHA-256 of each key, the encrypting one first: says which key a backup needs
    without holding it (camp/backup.py)."""
    return ["sha256:" + hashlib.sha256(k.strip()).hexdigest()[:32] for k in _keys()]


def encrypt_credentials(values: dict[str, str]) -> str:
    """Encrypt the non-empty credential fields; empty dict → empty string."""
    clean = {k: v for k, v in values.items() if k in CREDENTIAL_FIELDS and v}
    if not clean:
        return ""
    return _fernet().encrypt(json.dumps(clean, sort_keys=True).encode()).decode()


def decrypt_credentials(token: str) -> dict[str, Any]:
    if not token:
        return {}
    try:
        return dict(json.loads(_fernet().decrypt(token.encode())))
    except InvalidToken as exc:
        raise ValueError("The stored cluster credentials cannot be decrypted with the "
                         "configured CAMP_ENCRYPTION_KEY.") from exc


# Kubeconfig entries that make the client run a program (``exec`` credential plugins, the
# legacy ``auth-provider`` ones, which may refresh tokens with a command) or read files of
# the machine it runs on (a worker's own service-account token would then be sent to the
# kubeconfig's server). An uploaded kubeconfig must carry its credentials inline.
_USER_REFUSED = {"exec": "runs a command (exec credential plugin)",
                 "auth-provider": "uses an auth-provider plugin",
                 "tokenFile": "reads a token file", "client-certificate": "reads a certificate file",
                 "client-key": "reads a key file"}
_CLUSTER_REFUSED = {"certificate-authority": "reads a CA file"}


def kubeconfig_problems(text: str) -> list[str]:
    """Why a kubeconfig may not be stored (empty list: it may). Only inline credentials:
    token, username/password, ``client-certificate-data``/``client-key-data`` and
    ``certificate-authority-data``; never a command or a local file."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return [f"Not valid YAML: {exc.__class__.__name__}."]
    if not isinstance(doc, dict):
        return ["A kubeconfig is a YAML mapping (apiVersion, clusters, users, contexts)."]
    problems: list[str] = []
    for section, key, refused in (("users", "user", _USER_REFUSED),
                                  ("clusters", "cluster", _CLUSTER_REFUSED)):
        entries = doc.get(section) or []
        if not isinstance(entries, list):
            problems.append(f"'{section}' must be a list.")
            continue
        for entry in entries:
            body = entry.get(key) if isinstance(entry, dict) else None
            if not isinstance(body, dict):
                continue
            name = entry.get("name", "?")
            for field, why in refused.items():
                if field in body:
                    problems.append(f"{key.capitalize()} '{name}' {why} ('{field}'); only inline "
                                    f"credentials are accepted.")
    return problems
