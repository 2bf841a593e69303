# Drop the single-column indexes of foreign keys that a composite index or unique constraint
# already leads with (issue 35: each cost every write). Only the index is dropped
# (camp.migration_ops.drop_fk_indexes); the state records db_index=False.

import django.db.models.deletion
from django.db import migrations, models

from camp.migration_ops import drop_fk_indexes


class Migration(migrations.Migration):

    dependencies = [
        ('tenants', '0011_r11ident_oidc_session'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='auditevent',
                    name='project',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='tenants.project'),
                ),
                migrations.AlterField(
                    model_name='auditevent',
                    name='tenant',
                    field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='tenants.tenant'),
                ),
            ],
            database_operations=[drop_fk_indexes('tenants', [('auditevent', 'project'), ('auditevent', 'tenant')])],
        ),
    ]
