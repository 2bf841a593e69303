"""The audit chain anchored outside the database (issue 30, item 2): deleting the newest
rows, emptying the table, or scrubbing rows and recomputing the chain from genesis all pass
the chain's own check, and all contradict the last anchor."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from tenants.audit import GENESIS_HASH, _hashed_fields, compute_hash, verify_chain
from tenants.models import AuditEvent
from tests.conftest import World

from .test_audit import _as_superuser_bypassing_triggers, _sealed_events

pytestmark = pytest.mark.django_db


@pytest.fixture
def anchored(world: World, settings: Any, tmp_path: Path) -> list[AuditEvent]:
    settings.AUDIT_ANCHOR_PATH = str(tmp_path / "anchor.jsonl")
    settings.AUDIT_ANCHOR_KEY = "a-key-the-database-never-sees"
    events = _sealed_events()
    call_command("audit_anchor", stdout=StringIO())
    call_command("audit_verify", stdout=StringIO())  # intact: chain and anchor agree
    return events


def _chain_passes() -> bool:
    return not list(verify_chain(seal_first=False))


def test_deleting_the_newest_rows_contradicts_the_anchor(anchored: list[AuditEvent]) -> None:
    newest = [e.pk for e in anchored[-3:]]
    _as_superuser_bypassing_triggers("DELETE FROM tenants_auditevent WHERE id = ANY(%s)", [newest])
    assert _chain_passes()  # the chain alone cannot tell
    with pytest.raises(CommandError, match="anchor.*is gone"):
        call_command("audit_verify", stdout=StringIO())


def test_emptying_the_table_contradicts_the_anchor(anchored: list[AuditEvent]) -> None:
    _as_superuser_bypassing_triggers("DELETE FROM tenants_auditevent", [])
    assert _chain_passes()
    with pytest.raises(CommandError, match="is gone"):
        call_command("audit_verify", stdout=StringIO())


def test_a_recomputed_chain_contradicts_the_anchor(anchored: list[AuditEvent]) -> None:
    scrubbed = anchored[2]
    _as_superuser_bypassing_triggers("DELETE FROM tenants_auditevent WHERE id = %s", [scrubbed.pk])
    prev = GENESIS_HASH
    for event in AuditEvent.objects.order_by("chain_seq"):
        digest = compute_hash(_hashed_fields(event), prev)
        _as_superuser_bypassing_triggers(
            "UPDATE tenants_auditevent SET prev_hash = %s, hash = %s WHERE id = %s",
            [prev, digest, event.pk])
        prev = digest
    assert _chain_passes()  # consistent again from genesis
    with pytest.raises(CommandError, match="rewritten|rows were anchored"):
        call_command("audit_verify", stdout=StringIO())


def test_a_forged_anchor_line_is_refused(anchored: list[AuditEvent], settings: Any) -> None:
    path = Path(settings.AUDIT_ANCHOR_PATH)
    line = json.loads(path.read_text().splitlines()[-1])
    path.write_text(path.read_text() + json.dumps({**line, "seq": 1, "count": 1}) + "\n")
    with pytest.raises(CommandError, match="bad signature"):
        call_command("audit_verify", stdout=StringIO())


def test_truncate_is_refused_by_the_database(world: World) -> None:
    with pytest.raises(DatabaseError, match="TRUNCATE refused"), transaction.atomic():
        with connection.cursor() as cursor:
            # as any session but the test suite's flush between tests
            cursor.execute("SET LOCAL camp.audit_allow_truncate = 'off'")
            cursor.execute("TRUNCATE tenants_auditevent")
    assert AuditEvent.objects.exists()
