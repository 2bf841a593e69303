"""OpenSSH public keys: parse one ``authorized_keys``-style line and check it is a key we
accept (the wire format is RFC 4253 §6.6, RFC 5656 §3.1, RFC 8709 §4; the ``sk-`` types
are OpenSSH's PROTOCOL.u2f).

Accepted: ``ssh-ed25519``, ``ecdsa-sha2-nistp256/384/521``, ``ssh-rsa`` of at least
2048 bits, and the FIDO (security key) variants ``sk-ssh-ed25519@openssh.com`` and
``sk-ecdsa-sha2-nistp256@openssh.com``. DSA and short RSA keys are refused (OpenSSH
itself disabled DSA in 7.0 and refuses RSA below 1024; 2048 is today's floor). Line
options (``command="…" ssh-ed25519 …``) are refused: Camp writes the file.

The fingerprint is OpenSSH's: ``SHA256:`` + unpadded base64 of the blob's SHA-256.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

MIN_RSA_BITS = 2048
MAX_LINE = 16384
ECDSA_CURVES = {
    "ecdsa-sha2-nistp256": "nistp256",
    "ecdsa-sha2-nistp384": "nistp384",
    "ecdsa-sha2-nistp521": "nistp521",
}
ECDSA_POINT = {"nistp256": 65, "nistp384": 97, "nistp521": 133}  # uncompressed 0x04‖X‖Y
SK_ED25519 = "sk-ssh-ed25519@openssh.com"
SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com"
KEY_TYPES = ("ssh-ed25519", *ECDSA_CURVES, "ssh-rsa", SK_ED25519, SK_ECDSA)


class SshKeyError(ValueError):
    """The line is not an acceptable OpenSSH public key; the message says why."""


@dataclass(frozen=True)
class PublicKey:
    key_type: str
    blob: bytes
    comment: str
    bits: int

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(self.blob).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    @property
    def line(self) -> str:
        """The normalised line written to ``authorized_keys``."""
        text = f"{self.key_type} {base64.b64encode(self.blob).decode()}"
        return f"{text} {self.comment}" if self.comment else text


def _strings(blob: bytes) -> list[bytes]:
    """The blob's sequence of SSH ``string`` fields (uint32 length + bytes)."""
    out, i = [], 0
    while i < len(blob):
        if i + 4 > len(blob):
            raise SshKeyError("The key data is truncated.")
        (n,) = struct.unpack(">I", blob[i : i + 4])
        i += 4
        if n > len(blob) - i:
            raise SshKeyError("The key data is truncated.")
        out.append(blob[i : i + n])
        i += n
    return out


def _mpint_bits(value: bytes) -> int:
    return int.from_bytes(value, "big").bit_length()


def parse_public_key(text: str) -> PublicKey:
    """One OpenSSH public key line → its type, blob, comment and size; else ``SshKeyError``."""
    line = (text or "").strip()
    if not line:
        raise SshKeyError("Paste a public key (the contents of e.g. ~/.ssh/id_ed25519.pub).")
    if len(line) > MAX_LINE or "\n" in line or "\r" in line:
        raise SshKeyError("One key, on one line.")
    parts = line.split(None, 2)
    key_type = parts[0]
    if key_type not in KEY_TYPES:
        if key_type == "ssh-dss":
            raise SshKeyError("DSA keys are not accepted; use ssh-ed25519 (ssh-keygen -t ed25519).")
        if "-----BEGIN" in line:
            raise SshKeyError("This is a private key or PEM file: paste the .pub file instead.")
        raise SshKeyError(
            f"Unsupported key type {key_type[:40]!r} (or options before the key): "
            f"use one of {', '.join(KEY_TYPES)}."
        )
    if len(parts) < 2:
        raise SshKeyError("The key data is missing after its type.")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SshKeyError("The key data is not valid base64.") from exc
    comment = parts[2].strip() if len(parts) > 2 else ""
    fields = _strings(blob)
    if not fields or fields[0] != key_type.encode():
        raise SshKeyError(f"The key data does not match its type {key_type}.")
    bits = _check(key_type, fields)
    if not key_type.startswith("sk-"):
        # The cryptography library checks the mathematics too (RSA modulus, point on curve).
        try:
            load_ssh_public_key(f"{key_type} {parts[1]}".encode())
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise SshKeyError(f"This {key_type} key is malformed.") from exc
    return PublicKey(key_type=key_type, blob=blob, comment=comment[:200], bits=bits)


def _check(key_type: str, fields: list[bytes]) -> int:
    if key_type in ("ssh-ed25519", SK_ED25519):
        want = 3 if key_type == SK_ED25519 else 2  # sk keys add the application string
        if len(fields) != want or len(fields[1]) != 32:
            raise SshKeyError(f"This {key_type} key is malformed (an Ed25519 key is 32 bytes).")
        return 256
    if key_type == "ssh-rsa":
        if len(fields) != 3:
            raise SshKeyError("This ssh-rsa key is malformed.")
        bits = _mpint_bits(fields[2])
        if bits < MIN_RSA_BITS:
            raise SshKeyError(
                f"This RSA key has {bits} bits; at least {MIN_RSA_BITS} are required (or use ssh-ed25519)."
            )
        return bits
    curve = "nistp256" if key_type == SK_ECDSA else ECDSA_CURVES[key_type]
    want = 4 if key_type == SK_ECDSA else 3
    if len(fields) != want or fields[1] != curve.encode() or len(fields[2]) != ECDSA_POINT[curve]:
        raise SshKeyError(f"This {key_type} key is malformed.")
    return {"nistp256": 256, "nistp384": 384, "nistp521": 521}[curve]
