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
import json
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

CREDENTIAL_FIELDS = ("kubeconfig", "token", "ca_cert")


def _derived_key() -> bytes:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"camp-credentials", info=b"fernet")
    return base64.urlsafe_b64encode(hkdf.derive(settings.SECRET_KEY.encode()))


def _fernet() -> MultiFernet:
    keys = [k for k in getattr(settings, "CAMP_ENCRYPTION_KEYS", []) if k]
    fernets = [Fernet(k.encode()) for k in keys] or [Fernet(_derived_key())]
    return MultiFernet(fernets)


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
