from django.apps import AppConfig


class CampConfig(AppConfig):
    """The project package as an app: its system checks and `manage.py doctor`."""

    name = "camp"
    verbose_name = "Camp"

    def ready(self) -> None:
        from camp import (
            checks,  # noqa: F401  (registers the checks)
            pgtypes,
        )

        pgtypes.install()
