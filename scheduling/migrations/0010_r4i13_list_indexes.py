"""List indexes for the jobs API's filters (issue 13, round 3), and extended statistics on
(tenant, project): a project belongs to one tenant, so the planner, which multiplies the
selectivities of ``tenant = … AND project = …`` as if independent, underestimated such
pages by the number of projects (docs/BENCHMARKS.md §6, round 3)."""

from typing import Any

from django.db import migrations, models


def statistics_up(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("CREATE STATISTICS IF NOT EXISTS job_tenant_project (dependencies, ndistinct)"
                              " ON tenant_id, project_id FROM scheduling_job")
        schema_editor.execute("ANALYZE scheduling_job")


def statistics_down(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP STATISTICS IF EXISTS job_tenant_project")


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0009_r4serve_allocation_ready'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['tenant', 'state', '-submitted_at', '-id'], name='job_tenant_state_newest'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['cluster', '-submitted_at', '-id'], name='job_cluster_newest'),
        ),
        migrations.RunPython(statistics_up, statistics_down),
    ]
