"""Periodic ticks never pile up behind a slow worker (issue 32, finding 2): every beat entry
expires within two periods (30 s at least), so a stale tick is dropped on receipt rather than run late."""

from __future__ import annotations

from django.conf import settings

from camp.settings.tasks import tick_expiry


def test_every_periodic_tick_expires_within_its_period() -> None:
    assert settings.CELERY_BEAT_SCHEDULE
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        expires = entry.get("options", {}).get("expires")
        assert expires is not None, f"{name} never expires: a backlog of it would run to the end"
        assert 0 < expires <= tick_expiry(float(entry["schedule"])), name
        assert expires >= float(entry["schedule"]), name  # never before the next one is due
