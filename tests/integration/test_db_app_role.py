"""Web and worker as a role that owns nothing (issue 30, item 2): it writes Camp's tables and
appends and seals audit events, but cannot delete, truncate, or disable the audit triggers."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from tenants.audit import seal
from tenants.models import AuditEvent
from tests.conftest import World

pytestmark = pytest.mark.django_db


def _as_app(statement: str, params: list[object] | None = None) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL ROLE camp_app_test")
        cursor.execute(statement, params)


def test_the_app_role_cannot_rewrite_the_audit_log(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APP_DB_PASSWORD", "app-role-pw")
    call_command("db_app_role", "camp_app_test", stdout=StringIO())
    seal(wait=True)
    event = AuditEvent.objects.order_by("id").first()
    assert event is not None
    for statement, params in (("DELETE FROM tenants_auditevent WHERE id = %s", [event.pk]),
                              ("TRUNCATE tenants_auditevent", []),
                              ("ALTER TABLE tenants_auditevent DISABLE TRIGGER USER", []),
                              ("UPDATE tenants_auditevent SET action = 'x' WHERE id = %s", [event.pk])):
        with pytest.raises(DatabaseError, match="permission denied|must be owner"):
            _as_app(statement, params)
    # ... while everything else works: reading, writing other tables
    _as_app("SELECT count(*) FROM tenants_auditevent")
    _as_app("UPDATE tenants_project SET description = description")


def test_db_app_role_refuses_to_grant_the_owner_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment that gives web and worker the owner's URL (the mistake the two-role wiring
    prevents) is stopped at migration time, not silently "granted"."""
    from django.core.management.base import CommandError

    owner = connection.settings_dict["USER"]
    monkeypatch.setenv("APP_DATABASE_URL", f"postgres://{owner}:pw@127.0.0.1:5432/camp")
    with pytest.raises(CommandError, match="the owner"):
        call_command("db_app_role", "--from-url-env", "APP_DATABASE_URL", stdout=StringIO())
