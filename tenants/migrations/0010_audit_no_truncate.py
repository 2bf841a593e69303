"""TRUNCATE of the audit log is refused (issue 30, item 2).

Row triggers never see a TRUNCATE, so the chain could be emptied and restart from genesis
unnoticed by the database. A statement trigger refuses it, unless the session says
``SET camp.audit_allow_truncate = 'on'`` — only the test suite's flush between tests does
(camp/settings/test.py). That is no weaker than the table owner's own power to disable any
trigger: the defence against the owner is running web and worker as a role that owns
nothing (docs/DEPLOY.md) and the anchor outside the database (tenants/anchor.py).
"""

from django.db import migrations

PG_UP = """
CREATE OR REPLACE FUNCTION camp_audit_no_truncate() RETURNS trigger AS $$
BEGIN
    IF coalesce(current_setting('camp.audit_allow_truncate', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'tenants_auditevent is append-only: TRUNCATE refused'
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS camp_audit_no_truncate ON tenants_auditevent;
CREATE TRIGGER camp_audit_no_truncate BEFORE TRUNCATE ON tenants_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION camp_audit_no_truncate();
"""
PG_DOWN = """
DROP TRIGGER IF EXISTS camp_audit_no_truncate ON tenants_auditevent;
DROP FUNCTION IF EXISTS camp_audit_no_truncate();
"""


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_UP, params=None)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DOWN, params=None)


class Migration(migrations.Migration):
    dependencies = [("tenants", "0009_gg_guarantee_all_clusters")]
    operations = [migrations.RunPython(forwards, backwards)]
