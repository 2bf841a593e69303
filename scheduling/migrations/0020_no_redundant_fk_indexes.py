# Drop the single-column indexes of foreign keys that a composite index or unique constraint
# already leads with (issue 35: each cost every write). Only the index is dropped
# (camp.migration_ops.drop_fk_indexes); the state records db_index=False.

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from camp.migration_ops import drop_fk_indexes


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0019_r12_kueue_jobs'),
        ('tenants', '0012_auditevent_no_redundant_fk_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name='allocation',
                    name='cluster',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='allocations', to='scheduling.cluster'),
                ),
                migrations.AlterField(
                    model_name='allocation',
                    name='job',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='allocations', to='scheduling.job'),
                ),
                migrations.AlterField(
                    model_name='job',
                    name='cluster',
                    field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='scheduling.cluster'),
                ),
                migrations.AlterField(
                    model_name='job',
                    name='owner',
                    field=models.ForeignKey(db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='jobs', to=settings.AUTH_USER_MODEL),
                ),
                migrations.AlterField(
                    model_name='job',
                    name='project',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='tenants.project'),
                ),
                migrations.AlterField(
                    model_name='job',
                    name='tenant',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='jobs', to='tenants.tenant'),
                ),
                migrations.AlterField(
                    model_name='podgroup',
                    name='job',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='groups', to='scheduling.job'),
                ),
                migrations.AlterField(
                    model_name='schedulingdecision',
                    name='job',
                    field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='decisions', to='scheduling.job'),
                ),
            ],
            database_operations=[drop_fk_indexes('scheduling', [('allocation', 'cluster'), ('allocation', 'job'), ('job', 'cluster'), ('job', 'owner'), ('job', 'project'), ('job', 'tenant'), ('podgroup', 'job'), ('schedulingdecision', 'job')])],
        ),
    ]
