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
BACKFILL = "UPDATE tenants_auditevent SET chain_seq = id WHERE hash IS NOT NULL"


def forwards(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute("ALTER TABLE tenants_auditevent DISABLE TRIGGER camp_audit_append_only")
        schema_editor.execute(BACKFILL)
        schema_editor.execute("ALTER TABLE tenants_auditevent ENABLE TRIGGER camp_audit_append_only")
        schema_editor.execute(PG_SEALABLE, params=None)
    elif vendor == "sqlite":
        # Altering a column rebuilds an SQLite table without its triggers: put them back.
        triggers = importlib.import_module("tenants.migrations.0002_audit_append_only")
        schema_editor.execute("DROP TRIGGER IF EXISTS camp_audit_no_update")
        schema_editor.execute(BACKFILL)
        for statement in triggers.SQLITE_UP:
            schema_editor.execute(statement)


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_STRICT, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0005_merge_i13_saml'),
    ]

    operations = [
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
