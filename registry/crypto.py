"""Registry credentials at rest: Fernet (AES-128-CBC + HMAC-SHA256), keys from
``CAMP_ENCRYPTION_KEY`` like the cluster credentials (first encrypts, all decrypt, so
keys rotate); without it a key derived from SECRET_KEY with its own HKDF salt."""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


def _fernet() -> MultiFernet:
    keys = [k for k in getattr(settings, "CAMP_ENCRYPTION_KEYS", []) if k]
    if keys:
        return MultiFernet([Fernet(k.encode()) for k in keys])
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"camp-registry", info=b"fernet")
    return MultiFernet([Fernet(base64.urlsafe_b64encode(hkdf.derive(settings.SECRET_KEY.encode())))])


def encrypt_secret(value: str) -> str:
    return _fernet().encrypt(value.encode()).decode() if value else ""


def decrypt_secret(token: str) -> str:
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken as exc:
        raise ValueError("The stored registry credentials cannot be decrypted with the "
                         "configured CAMP_ENCRYPTION_KEY.") from exc
