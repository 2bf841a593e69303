"""The audit chain's anchor outside the database (issue 30, item 2).

The hash chain (tenants/audit.py) proves that no row *inside* the chain was edited, but
whoever can write the table can also delete its newest rows, empty it, or rewrite it and
recompute every hash from genesis: the chain is then consistent again. So the chain's head
is published, periodically, where the database role cannot rewrite it: one JSON line per
checkpoint appended to ``AUDIT_ANCHOR_PATH`` (mount it from an append-only volume, a
``chattr +a`` file, or ship it to syslog/an object store with object lock), each line signed
with ``AUDIT_ANCHOR_KEY`` (HMAC-SHA256), a key the database never holds.

``audit_verify`` then checks the chain against the last anchor: the anchored row must still
be there with the anchored hash, and exactly the anchored number of sealed rows must be at
or before it. Deleting the newest rows, TRUNCATE, or a recompute after scrubbing rows all
fail that check, for everything up to the last checkpoint (``AUDIT_ANCHOR_SECONDS``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from .models import AuditEvent


@dataclass(frozen=True)
class Anchor:
    seq: int
    hash: str
    count: int
    at: str


def _key() -> bytes:
    return str(getattr(settings, "AUDIT_ANCHOR_KEY", "") or "").encode()


def _sign(body: dict[str, Any]) -> str:
    payload = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(_key(), payload, hashlib.sha256).hexdigest()


def chain_head() -> Anchor | None:
    """The newest sealed row: its chain position and hash, and how many rows are sealed."""
    head = (AuditEvent.objects.filter(chain_seq__isnull=False).order_by("-chain_seq")
            .values_list("chain_seq", "hash").first())
    if head is None:
        return None
    count = AuditEvent.objects.filter(chain_seq__isnull=False).count()
    return Anchor(seq=int(head[0] or 0), hash=str(head[1]), count=count, at=timezone.now().isoformat())


def anchor_write(path: str | None = None) -> Anchor | None:
    """Append the current head to the anchor file (O_APPEND: never rewrites a line).
    None when nothing is sealed yet or no anchor path is configured."""
    path = path if path is not None else settings.AUDIT_ANCHOR_PATH
    if not path:
        return None
    head = chain_head()
    if head is None:
        return None
    body = {"seq": head.seq, "hash": head.hash, "count": head.count, "at": head.at}
    line = json.dumps({**body, "sig": _sign(body) if _key() else ""}, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return head


def last_anchor(path: str) -> tuple[Anchor | None, list[str]]:
    """The last well-formed, correctly signed line of the anchor file, and the problems met."""
    problems: list[str] = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None, [f"the anchor file {path} is missing"]
    for number, raw in reversed(list(enumerate(lines, start=1))):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
            body = {k: data[k] for k in ("seq", "hash", "count", "at")}
        except (ValueError, KeyError, TypeError):
            problems.append(f"anchor line {number} is not a checkpoint")
            continue
        if _key() and not hmac.compare_digest(str(data.get("sig", "")), _sign(body)):
            problems.append(f"anchor line {number} has a bad signature (forged, or another key)")
            return None, problems
        return Anchor(seq=int(body["seq"]), hash=str(body["hash"]), count=int(body["count"]),
                      at=str(body["at"])), problems
    return None, problems


def verify_anchor(path: str | None = None) -> list[str]:
    """What contradicts the last anchor (empty: the chain holds everything it anchored)."""
    path = path if path is not None else settings.AUDIT_ANCHOR_PATH
    if not path:
        return []
    anchor, problems = last_anchor(path)
    if anchor is None:
        return problems
    row = AuditEvent.objects.filter(chain_seq=anchor.seq).values_list("hash", flat=True).first()
    if row is None:
        problems.append(f"the row anchored at chain position {anchor.seq} ({anchor.at}) is gone: "
                        "rows were deleted or the table was emptied")
    elif row != anchor.hash:
        problems.append(f"the row at chain position {anchor.seq} no longer has the anchored hash: "
                        "the chain was rewritten and recomputed")
    sealed = AuditEvent.objects.filter(chain_seq__isnull=False, chain_seq__lte=anchor.seq).count()
    if sealed != anchor.count:
        problems.append(f"{anchor.count} rows were anchored up to chain position {anchor.seq}; "
                        f"{sealed} are there")
    return problems
