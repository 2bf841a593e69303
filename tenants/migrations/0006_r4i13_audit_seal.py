"""The audit chain sealed after commit (issue 13, tenants/audit.py).

Events are inserted unsealed (no prev_hash, hash, chain_seq) with no lock, and chained
shortly after their commit by one sealer at a time. ``chain_seq`` is the chain's order:
rows chained before this migration were chained in id order, so their position is their id
(gaps are fine: the links are what is verified). The append-only trigger now lets one kind
of UPDATE through: sealing an unsealed row (its three chain columns, from empty, once), with
every other column unchanged. SQLite (the demo) seals on insert, so its triggers stay.
"""

import importlib
from typing import Any

from django.db import migrations, models

PG_SEALABLE = """
CREATE OR REPLACE FUNCTION camp_audit_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND OLD.hash IS NULL AND OLD.prev_hash IS NULL AND OLD.chain_seq IS NULL
       AND NEW.hash IS NOT NULL AND NEW.prev_hash IS NOT NULL AND NEW.chain_seq IS NOT NULL
       AND (to_jsonb(OLD) - ARRAY['hash', 'prev_hash', 'chain_seq'])
           = (to_jsonb(NEW) - ARRAY['hash', 'prev_hash', 'chain_seq'])
    THEN
        RETURN NEW;  -- sealing: the chain link, written once
    END IF;
    RAISE EXCEPTION 'tenants_auditevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""
PG_STRICT = """
CREATE OR REPLACE FUNCTION camp_audit_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'tenants_auditevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""
# An event is inserted either unsealed (all three chain columns empty: Camp on PostgreSQL) or
# sealed (all three set: Camp on SQLite, a restore); never half of it.
PG_INSERT_CHECK = """
CREATE OR REPLACE FUNCTION camp_audit_insert_check() RETURNS trigger AS $$
BEGIN
    IF (NEW.hash IS NULL) = (NEW.prev_hash IS NULL) AND (NEW.hash IS NULL) = (NEW.chain_seq IS NULL) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'tenants_auditevent: an event is inserted wholly unsealed or wholly sealed'
        USING ERRCODE = 'check_violation';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS camp_audit_insert_check ON tenants_auditevent;
CREATE TRIGGER camp_audit_insert_check BEFORE INSERT ON tenants_auditevent
    FOR EACH ROW EXECUTE FUNCTION camp_audit_insert_check();
"""
PG_INSERT_CHECK_DOWN = """
DROP TRIGGER IF EXISTS camp_audit_insert_check ON tenants_auditevent;
DROP FUNCTION IF EXISTS camp_audit_insert_check();
"""
# Going back to writers that chain in id order under a lock is only sound when the chain is
# already in id order and complete.
PG_CAN_REVERSE = """
SELECT EXISTS (SELECT 1 FROM tenants_auditevent WHERE hash IS NULL OR chain_seq IS NULL)
    OR EXISTS (SELECT 1 FROM (SELECT chain_seq, lag(chain_seq) OVER (ORDER BY id) AS before_it
                              FROM tenants_auditevent) AS c WHERE c.chain_seq < c.before_it)
"""
BACKFILL = "UPDATE tenants_auditevent SET chain_seq = id WHERE hash IS NOT NULL"


def forwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("ALTER TABLE tenants_auditevent DISABLE TRIGGER camp_audit_append_only")
        schema_editor.execute(BACKFILL)
        schema_editor.execute("ALTER TABLE tenants_auditevent ENABLE TRIGGER camp_audit_append_only")
        schema_editor.execute(PG_SEALABLE, params=None)
        schema_editor.execute(PG_INSERT_CHECK, params=None)
    elif vendor == "sqlite":
        # Altering a column rebuilds an SQLite table without its triggers: put them back.
        triggers = importlib.import_module("tenants.migrations.0002_audit_append_only")
        schema_editor.execute("DROP TRIGGER IF EXISTS camp_audit_no_update")
        schema_editor.execute(BACKFILL)
        for statement in triggers.SQLITE_UP:
            schema_editor.execute(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(PG_CAN_REVERSE)
            if cursor.fetchone()[0]:
                raise RuntimeError(
                    "tenants 0006 cannot be reversed: some audit events are not sealed yet or the "
                    "chain is not in id order (run `manage.py audit_verify`, which seals, with every "
                    "writer stopped; a chain sealed out of id order cannot go back to id order)")
        schema_editor.execute(PG_INSERT_CHECK_DOWN, params=None)
        schema_editor.execute(PG_STRICT, params=None)



def sqlite_triggers_back(apps: Any, schema_editor: Any) -> None:
    """Reversing: the column changes rebuilt the SQLite table without its append-only
    triggers; this runs last (first operation, reversed last) and puts them back."""
    if schema_editor.connection.vendor == "sqlite":
        triggers = importlib.import_module("tenants.migrations.0002_audit_append_only")
        for statement in triggers.SQLITE_UP:
            schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0005_merge_i13_saml'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, sqlite_triggers_back),
        migrations.AddField(
            model_name='auditevent',
            name='chain_seq',
            field=models.BigIntegerField(blank=True, help_text='Position in the hash chain (order of sealing).', null=True, unique=True),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='hash',
            field=models.CharField(blank=True, max_length=64, null=True, unique=True),
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='prev_hash',
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddIndex(
            model_name='auditevent',
            index=models.Index(condition=models.Q(('hash__isnull', True)), fields=['id'], name='audit_unsealed'),
        ),
        migrations.RunPython(forwards, backwards),
    ]
