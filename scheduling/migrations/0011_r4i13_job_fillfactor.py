"""Room on each page of the job table for its rows' next versions (issue 13, round 3).

A cycle rewrites the reason and queue position of every waiting job whose *why* or place
changed (18,400 rows in a sweep's first cycle). None of those columns is indexed, so
PostgreSQL can write the new version on the same page without touching the table's 16
indexes (a HOT update) — but only if the page has room, which at the default fill factor
(100) it has not: 2 % of such updates were HOT on the benchmark's database. At 70 a newly
written page keeps 30 % free. Pages written before this migration keep their layout until
they are rewritten (``VACUUM FULL scheduling_job`` or ``pg_repack`` applies it at once)."""

from typing import Any

from django.db import migrations


def forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE scheduling_job SET (fillfactor = 70)")


def backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE scheduling_job RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0010_r4i13_list_indexes")]
    operations = [migrations.RunPython(forwards, backwards)]
