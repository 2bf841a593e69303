"""Make the audit table append-only in the database itself.

PostgreSQL: a trigger raises on every UPDATE or DELETE of a row. SQLite (the
demo): the same with RAISE(ABORT). TRUNCATE stays possible for the table owner
(test-database flushes need it); production grants the application role no
TRUNCATE (docs/ARCHITECTURE.md).
"""

from typing import Any

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION camp_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'tenants_auditevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS camp_audit_append_only ON tenants_auditevent;
CREATE TRIGGER camp_audit_append_only BEFORE UPDATE OR DELETE ON tenants_auditevent
    FOR EACH ROW EXECUTE FUNCTION camp_audit_append_only();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS camp_audit_append_only ON tenants_auditevent;
DROP FUNCTION IF EXISTS camp_audit_append_only();
"""
SQLITE_UP = [
    """CREATE TRIGGER IF NOT EXISTS camp_audit_no_update BEFORE UPDATE ON tenants_auditevent
       BEGIN SELECT RAISE(ABORT, 'tenants_auditevent is append-only: UPDATE refused'); END;""",
    """CREATE TRIGGER IF NOT EXISTS camp_audit_no_delete BEFORE DELETE ON tenants_auditevent
       BEGIN SELECT RAISE(ABORT, 'tenants_auditevent is append-only: DELETE refused'); END;""",
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS camp_audit_no_update;",
    "DROP TRIGGER IF EXISTS camp_audit_no_delete;",
]


def forwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_UP:
            schema_editor.execute(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)
    elif vendor == "sqlite":
        for statement in SQLITE_DOWN:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
