"""Camp: an open-source AI compute scheduling platform."""

from .celery import app as celery_app

__all__ = ("celery_app",)
