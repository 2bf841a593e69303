"""Reaching a running environment: one-time links and cookie nonces, retiring access when a run
ends, and the user's SSH key store."""

from __future__ import annotations

import datetime as dt
import hashlib
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from scheduling.models import (
    FINAL_STATES,
)
from tenants import permissions
from tenants.audit import audit_record, snapshot
from tenants.models import User

from ..models import (
    DevEnvironment,
    SshKey,
)
from ..sshkeys import SshKeyError, parse_public_key
from .common import _require


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


ACCESS_FIELDS = ["access_token_hash", "access_token_issued_at", "access_token_used_at", "access_nonce"]


def link_ttl_seconds() -> int:
    return int(getattr(settings, "WORKSPACES_LINK_TTL_SECONDS", 300))


def _issue_link(env: DevEnvironment) -> str:
    """A new one-time link token (returned; only its hash is kept) and a new cookie nonce, so
    every older link and cookie stops working. The caller saves ``ACCESS_FIELDS``."""
    token = secrets.token_urlsafe(32)
    env.access_token_hash = hash_token(token)
    env.access_token_issued_at = timezone.now()
    env.access_token_used_at = None
    env.access_nonce = secrets.token_urlsafe(32)
    return token


def _retire_access(env: DevEnvironment) -> None:
    """No link and no cookie opens it any more (a stop, the end of a run)."""
    env.access_token_hash = ""
    env.access_token_issued_at = None
    env.access_token_used_at = None
    env.access_nonce = ""


def _clean_ssh_keys(text: str) -> str:
    """Keys given for one environment: the same rules as the user's key store."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    if len(lines) > 20:
        raise ValidationError({"ssh_public_keys": ["At most 20 keys."]})
    out = []
    for n, line in enumerate(lines, 1):
        try:
            out.append(parse_public_key(line).line)
        except SshKeyError as exc:
            raise ValidationError({"ssh_public_keys": [f"Line {n}: {exc}"]}) from exc
    return "\n".join(out)


def token_matches(env: DevEnvironment, token: str) -> bool:
    """Is ``token`` the current link's (spent or not, fresh or not)?"""
    return bool(env.access_token_hash) and secrets.compare_digest(env.access_token_hash, hash_token(token))


def environment_link_redeem(*, env_id: int, token: str) -> str | None:
    """Spend a link token: accepted once, within ``WORKSPACES_LINK_TTL_SECONDS`` of being
    issued. Returns the environment's cookie nonce, or None. The row lock makes two
    concurrent requests with the same link spend it at most once. The caller has checked
    that the owner may still reach the environment and that it runs."""
    if not token:
        return None
    now = timezone.now()
    with transaction.atomic():
        env = DevEnvironment.objects.select_for_update().filter(pk=env_id).first()
        if (
            env is None
            or not env.access_nonce
            or env.access_token_used_at is not None
            or env.access_token_issued_at is None
            or now - env.access_token_issued_at > dt.timedelta(seconds=link_ttl_seconds())
            or not token_matches(env, token)
        ):
            return None
        env.access_token_used_at = now
        env.save(update_fields=["access_token_used_at"])
        return env.access_nonce


def environments_retire_access() -> int:
    """Environments whose run has ended (failed, lost, finished) without a stop through
    Camp: retire their link and cookies, so a later run needs a new link."""
    return (
        DevEnvironment.objects.exclude(access_nonce="", access_token_hash="")
        .filter(Q(job__isnull=True) | Q(job__state__in=FINAL_STATES))
        .update(access_token_hash="", access_token_issued_at=None, access_token_used_at=None,
                access_nonce="")
    )


# --- SSH keys ---------------------------------------------------------------------------------

MAX_SSH_KEYS = 50


@transaction.atomic
def ssh_key_add(*, actor: User, name: str, public_key: str) -> SshKey:
    """Store one of ``actor``'s OpenSSH public keys (validated; fingerprint kept). SSH
    environments of theirs authorise it from their next start."""
    try:
        parsed = parse_public_key(public_key)
    except SshKeyError as exc:
        raise ValidationError({"public_key": [str(exc)]}) from exc
    name = (name or "").strip() or parsed.comment[:100] or parsed.key_type
    key = SshKey(user=actor, name=name[:100], key_type=parsed.key_type, public_key=parsed.line,
                 fingerprint=parsed.fingerprint, bits=parsed.bits)
    _require(actor, permissions.CREATE, key)
    User.objects.select_for_update(no_key=True).filter(pk=actor.pk).first()  # serialise the count check
    if SshKey.objects.filter(user=actor).count() >= MAX_SSH_KEYS:
        raise ValidationError({"public_key": [f"At most {MAX_SSH_KEYS} keys per user."]})
    if SshKey.objects.filter(user=actor, fingerprint=parsed.fingerprint).exists():
        raise ValidationError({"public_key": ["You already added this key."]})
    if SshKey.objects.filter(user=actor, name=key.name).exists():
        raise ValidationError({"name": ["You already have a key with this name."]})
    key.save()
    audit_record(actor=actor, action="ssh_key.added", target=key, after=snapshot(key, SSH_KEY_FIELDS))
    return key


@transaction.atomic
def ssh_key_delete(*, actor: User, key: SshKey) -> None:
    _require(actor, permissions.DELETE, key)
    audit_record(actor=actor, action="ssh_key.deleted", target=key, before=snapshot(key, SSH_KEY_FIELDS))
    key.delete()


SSH_KEY_FIELDS = ("user", "name", "key_type", "bits", "fingerprint")
