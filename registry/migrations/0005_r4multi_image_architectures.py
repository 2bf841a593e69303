from django.db import migrations, models

import registry.models


class Migration(migrations.Migration):
    """Images record the platforms they are built for. Images catalogued before this
    migration get none (unknown: their jobs are not restricted, as for an image not in the
    catalog) — not ``["linux/amd64"]``, which would reject their jobs on an ARM cluster after
    the upgrade. Images created from now on default to ``["linux/amd64"]``."""

    dependencies = [
        ('registry', '0004_r4serve_inference_images'),
    ]

    operations = [
        migrations.AddField(
            model_name='image',
            name='architectures',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.AlterField(
            model_name='image',
            name='architectures',
            field=models.JSONField(blank=True, default=registry.models.default_architectures, help_text='The platforms the image is built for, e.g. ["linux/amd64", "linux/arm64"]: a job using it only goes to nodes of one of them. Empty: unknown (no restriction).'),
        ),
    ]
