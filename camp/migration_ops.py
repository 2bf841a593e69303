"""Migration operations shared by apps' migrations."""

from __future__ import annotations

from typing import Any

from django.db import migrations


def drop_fk_indexes(app_label: str, fields: list[tuple[str, str]]) -> migrations.RunPython:
    """Drop the single-column index Django made for each foreign key ``(model, field)``, and
    nothing else: its constraint stays as it is. Hand-written because ``AlterField(db_index=
    False)`` drops and re-adds the foreign-key constraint too, which re-validates every row of
    the table under an exclusive lock (a large jobs table would be locked for the scan). Pair it
    with the ``AlterField`` as its state (``SeparateDatabaseAndState``); the reverse makes the
    indexes again."""

    def _each(apps: Any, schema_editor: Any) -> Any:
        for model_name, field_name in fields:
            model = apps.get_model(app_label, model_name)
            yield model, model._meta.get_field(field_name)

    def forward(apps: Any, schema_editor: Any) -> None:
        for model, field in _each(apps, schema_editor):
            # index=True, unique=False: the plain index on exactly this column (a foreign key's
            # constraint, a unique constraint or a composite index is never matched).
            for name in schema_editor._constraint_names(model, [field.column], index=True, unique=False,
                                                        primary_key=False):
                schema_editor.execute(schema_editor._delete_index_sql(model, name))

    def backward(apps: Any, schema_editor: Any) -> None:
        for model, field in _each(apps, schema_editor):
            schema_editor.execute(schema_editor._create_index_sql(model, fields=[field]))

    return migrations.RunPython(forward, backward)
