"""Login throttling an attacker cannot reset (issue 30, item 1).

A success clears only the signed-in account's own failures from that address: the
attacker's own valid account must not wipe the victim's failures nor the address's count.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tenants.models import User

from .conftest import configure

ATTACKER = "10.0.0.66"


def _user(username: str, password: str, **extra: Any) -> User:
    user = User.objects.create(username=username, email=f"{username}@example.test", **extra)
    user.set_password(password)
    user.save()
    return user


def _login(username: str, password: str, addr: str = ATTACKER) -> int:
    return Client(REMOTE_ADDR=addr).post(
        "/login/", {"username": username, "password": password}).status_code


@pytest.mark.django_db
def test_own_success_does_not_reset_the_victims_failures(settings: Any) -> None:
    configure(settings)
    settings.AXES_FAILURE_LIMIT = 5
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 20
    _user("vince", "vince-secret-pw")
    _user("mallory", "mallory-own-pw")
    codes = []
    for _ in range(3):  # 4 guesses at vince, then one login as the attacker's own account
        codes += [_login("vince", f"guess{i}") for i in range(4)]
        assert _login("mallory", "mallory-own-pw") in (302, 429)
    # the victim's pair locked at its limit, whatever the attacker's own logins did
    assert 429 in codes and codes.index(429) == 4  # the 5th guess locks the pair
    assert _login("vince", "vince-secret-pw") == 429  # the right password does not help
    # vince from his own address is not affected
    assert _login("vince", "vince-secret-pw", addr="10.0.0.4") == 302


@pytest.mark.django_db
def test_own_success_does_not_reset_the_address_count(settings: Any) -> None:
    configure(settings)
    settings.AXES_FAILURE_LIMIT = 5
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 8
    _user("mallory", "mallory-own-pw")
    _user("lena", "lena-pw-123456")
    statuses = []
    for round_ in range(4):  # spray 3 names, then log in as oneself: never a reset
        statuses += [_login(f"user{round_}-{i}", "guess") for i in range(3)]
        _login("mallory", "mallory-own-pw")
    assert 429 in statuses  # the address locked at 8 failures, within the 12
    assert _login("lena", "lena-pw-123456") == 429


@pytest.mark.django_db
def test_address_lock_spares_break_glass_admin_and_signed_in_users(settings: Any) -> None:
    configure(settings)
    settings.AXES_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 6
    _user("root", "break-glass-pw", is_platform_admin=True)
    _user("lena", "lena-pw-123456")
    signed_in = Client(REMOTE_ADDR=ATTACKER)
    assert signed_in.post("/login/", {"username": "lena", "password": "lena-pw-123456"}
                          ).status_code == 302
    for i in range(8):
        _login(f"x{i}", "guess")
    assert _login("lena", "lena-pw-123456") == 429  # the address is locked for plain accounts
    assert _login("root", "break-glass-pw") == 302  # ... not for the break-glass local admin
    # a signed-in user at that address keeps working and may sign in again
    assert signed_in.get("/").status_code in (200, 302)
    assert signed_in.get("/").status_code != 429
    assert signed_in.post("/login/", {"username": "lena", "password": "lena-pw-123456"}
                          ).status_code == 302
    # the admin's own pair still locks
    for _ in range(3):
        _login("root", "wrong")
    assert _login("root", "break-glass-pw") == 429
