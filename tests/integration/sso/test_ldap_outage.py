"""A directory outage locks nobody out (issue 31, item 2).

With the directory down (a real slapd, stopped) or hung (a TCP server that accepts and
never answers), an LDAP login says the directory is unavailable, is not counted by
django-axes, and never stands between a local account (the break-glass admin) and
its login.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from axes.models import AccessAttempt
from django.test import Client

from tenants.models import AuditEvent, User

from .conftest import configure, ldap_config
from .servers import HERE, Slapd, free_port

pytestmark = pytest.mark.django_db

OFFICE = "10.20.30.40"  # everyone behind one NAT address
UNAVAILABLE = "the directory is unavailable"


@pytest.fixture
def own_slapd(tmp_path: Path) -> Iterator[Slapd]:
    """A slapd of this test's own, so stopping it leaves the session's server alone."""
    server = Slapd(tmp_path / "slapd")
    try:
        server.start()
        server.ldif((HERE / "data" / "directory.ldif").read_text())
        yield server
    finally:
        server.stop()


class HungServer:
    """Accepts LDAP connections and never answers (a hung directory or a black-holed proxy)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", free_port()))
        self.sock.listen(64)
        self.uri = f"ldap://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)  # keep it open, read nothing, answer nothing

    def stop(self) -> None:
        self.stopped.set()
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def hung() -> Iterator[HungServer]:
    server = HungServer()
    try:
        yield server
    finally:
        server.stop()


def break_glass() -> User:
    admin = User.objects.create(username="breakglass", is_platform_admin=True)
    admin.set_password("break-glass-pw-1")
    admin.save()
    return admin


def login(username: str, password: str, addr: str = OFFICE) -> Any:
    client = Client(REMOTE_ADDR=addr)
    response = client.post("/login/", {"username": username, "password": password})
    response.client_session = client.session
    return response


def _outage_is_not_a_failure(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_LIMIT_PER_IP = 6
    # More tries than both limits, by several people behind one address.
    for i in range(8):
        response = login("alice" if i % 2 else "bob", f"{'alice' if i % 2 else 'bob'}-ldap-pw")
        assert response.status_code == 200, response.status_code
        assert UNAVAILABLE in response.content.decode()
        assert "Please enter a correct username and password" not in response.content.decode()
        assert "_auth_user_id" not in response.client_session
    assert not AccessAttempt.objects.exists()  # axes counted nothing
    assert not AuditEvent.objects.filter(action__in=["auth.login_failed", "auth.locked_out"]).exists()
    refused = AuditEvent.objects.filter(action="auth.login_refused", after__source="ldap")
    assert refused.count() == 8
    assert {e.after["reason"] for e in refused} == {"directory unavailable"}
    # The break-glass local admin signs in from the same address, during the outage.
    assert login("breakglass", "break-glass-pw-1").status_code == 302
    # A wrong local password is still a failure (the directory plays no part in it).
    assert login("breakglass", "wrong").status_code == 200
    assert AccessAttempt.objects.filter(username="breakglass").exists()


def test_directory_down_says_so_counts_nothing_and_spares_local_accounts(
        settings: Any, own_slapd: Slapd, acme: Any) -> None:
    break_glass()
    configure(settings, ldap=ldap_config(own_slapd))
    own_slapd.stop()
    _outage_is_not_a_failure(settings)
    # Back up: the people who tried during the outage are not locked out.
    own_slapd.start()
    assert login("alice", "alice-ldap-pw").status_code == 302
    assert login("bob", "bob-ldap-pw").status_code == 302


def test_directory_hung_says_so_counts_nothing_and_spares_local_accounts(
        settings: Any, hung: HungServer, acme: Any) -> None:
    break_glass()
    config = ldap_config(hung)  # type: ignore[arg-type]  # only .uri is read
    configure(settings, ldap={**config, **_timeout(config, 1)})
    _outage_is_not_a_failure(settings)


def _timeout(config: dict[str, Any], seconds: int) -> dict[str, Any]:
    import ldap

    options = dict(config["AUTH_LDAP_CONNECTION_OPTIONS"])
    options[ldap.OPT_NETWORK_TIMEOUT] = seconds
    options[ldap.OPT_TIMEOUT] = seconds
    return {"AUTH_LDAP_CONNECTION_OPTIONS": options}
