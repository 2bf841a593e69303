"""The Celery application. Tasks are thin entry points (DESIGN.md §5)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "camp.settings")

app = Celery("camp")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
