"""Seed the platform's base images (registry/catalog.py); idempotent."""

from django.db import migrations


def seed(apps, schema_editor):
    from registry.catalog import seed_base_images

    seed_base_images(apps.get_model("registry", "Image"))


class Migration(migrations.Migration):
    dependencies = [("registry", "0001_initial")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
