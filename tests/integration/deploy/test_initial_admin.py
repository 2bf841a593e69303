"""Issue 33, item 7: the first platform admin from the deployment's settings (the chart's
initialAdmin values, compose's secrets), created once and never reset."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tenants.models import AuditEvent, User


@pytest.fixture
def admin_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The password as the chart mounts it: a file named by CAMP_ADMIN_PASSWORD_FILE."""
    secret = tmp_path / "password"
    secret.write_text("first-Install-password-7731\n")
    monkeypatch.setenv("CAMP_ADMIN_PASSWORD_FILE", str(secret))
    monkeypatch.delenv("CAMP_ADMIN_PASSWORD", raising=False)
    return secret


@pytest.mark.django_db
def test_creates_the_admin_once_and_never_resets_a_changed_password(
    admin_secret: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CAMP_ADMIN_USERNAME", raising=False)
    call_command("initial_admin")
    assert "nothing to do" in capsys.readouterr().out
    assert not User.objects.exists()

    monkeypatch.setenv("CAMP_ADMIN_USERNAME", "platform")
    call_command("initial_admin")
    admin = User.objects.get(username="platform")
    assert admin.is_platform_admin and admin.check_password("first-Install-password-7731")
    event = AuditEvent.objects.get(action="user.created", target_id=str(admin.pk))
    assert event.actor_username == "initial_admin"
    assert "first-Install" not in str(event.after)

    # The admin changes the password in the console; every later upgrade runs the command
    # again (with the same or a new value in the Secret): the changed password stays.
    admin.set_password("changed-by-the-admin-5521")
    admin.save()
    admin_secret.write_text("a-new-value-in-the-secret-9902")
    call_command("initial_admin")
    assert "left as it is" in capsys.readouterr().out
    admin.refresh_from_db()
    assert admin.check_password("changed-by-the-admin-5521")
    assert User.objects.filter(username="platform").count() == 1


@pytest.mark.django_db
def test_refuses_a_weak_or_missing_password_and_creates_nobody(
    admin_secret: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAMP_ADMIN_USERNAME", "platform")
    admin_secret.write_text("password")
    with pytest.raises(CommandError, match="refused"):
        call_command("initial_admin")
    monkeypatch.delenv("CAMP_ADMIN_PASSWORD_FILE")
    with pytest.raises(CommandError, match="no CAMP_ADMIN_PASSWORD"):
        call_command("initial_admin")
    assert not User.objects.filter(username="platform").exists()
