"""A web process's PostgreSQL connections are its pool's, however many requests are in flight
(issue 35). Under ASGI each request runs in a thread of its own; without a pool each opened a
connection of its own, so an overloaded server opened one per waiting request until PostgreSQL's
``max_connections`` refused them all (the open-loop benchmark: 305 connections, most requests
500). Here a real uvicorn process with ``DB_POOL_MAX_SIZE=2`` takes a burst of 24 concurrent
clients: every request is answered, and the server never holds more than 2 connections. Then
its connections are killed (as a PostgreSQL restart or an idle-connection reaper would): the
next requests are answered, not failed with the dead connections (checked at checkout)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests
from django.conf import settings
from django.db import connection, connections

from tenants import services as tenant_services
from tenants.services import TOKEN_PREFIX

from .tools import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

POOL = 2


def _dsn() -> str:
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


SERVER_APP_NAME = "camp-pool-test-server"
"""The server's connections say so (libpq's PGAPPNAME): a connection this test process opens
meanwhile (a fixture, an audit seal after commit) is not counted as the server's."""


def _server_backends(dsn: str, exclude: set[int]) -> set[int]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid <> pg_backend_pid() AND application_name = %s",
                            [SERVER_APP_NAME]).fetchall()
    return {r[0] for r in rows} - exclude


@contextmanager
def _uvicorn(tmp_path: Path, dsn: str, before: set[int], owner: str = "", **extra: str) -> Iterator[str]:
    """A real uvicorn process of camp.asgi with a pool of POOL against ``dsn``; its base URL.
    Its leftover backends are ended as ``owner`` (default: ``dsn``'s role)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.test", "DATABASE_URL": dsn,
           "CAMP_TEST_RUN_ID": str(settings.TEST_RUN_ID), "DB_POOL_MAX_SIZE": str(POOL),
           "DB_POOL_TIMEOUT": "60",
           # the whole burst may queue for the 2 slots (camp/admission.py: 4 × the pool by default)
           "WEB_MAX_WAITING": "100", "PGAPPNAME": SERVER_APP_NAME, **extra}
    log = (tmp_path / "web.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "camp.asgi:application", "--host",
                               "127.0.0.1", "--port", str(port), "--workers", "1", "--no-access-log"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "web.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        leftover = _server_backends(owner or dsn, before)
        if leftover:  # so the test database can be dropped
            with psycopg.connect(owner or dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY(%s)",
                             [list(leftover)])


@pytest.fixture
def pooled_server(transactional_db: Any, tmp_path: Path) -> Iterator[tuple[str, str, set[int]]]:
    dsn = _dsn()
    connection.ensure_connection()  # the test's own connection is not the server's
    before = _server_backends(dsn, set())
    with _uvicorn(tmp_path, dsn, before) as base:
        yield base, dsn, before


def _burst(base: str, token: str, dsn: str, before: set[int]) -> tuple[list[int], int]:
    """24 clients, 4 requests each, all at once; the most connections the server held meanwhile."""
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, len(_server_backends(dsn, before)))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        headers = {"Authorization": f"Bearer {token}"}
        with ThreadPoolExecutor(24) as pool:
            statuses = list(pool.map(lambda _: requests.get(
                f"{base}/api/v1/jobs/", headers=headers, timeout=120).status_code, range(96)))
    finally:
        done.set()
        sampler.join()
    return statuses, peak


def test_a_burst_is_answered_within_the_pool_and_dead_connections_are_replaced(
        world: Any, pooled_server: tuple[str, str, set[int]]) -> None:
    base, dsn, before = pooled_server
    _, token = tenant_services.token_create(actor=world.a.member, name="burst")

    statuses, peak = _burst(base, token, dsn, before)
    assert statuses == [200] * 96
    assert 1 <= peak <= POOL, f"the server held {peak} connections with a pool of {POOL}"

    # Its pooled connections die (a PostgreSQL restart, a reaper): the next burst is answered.
    held = list(_server_backends(dsn, before))
    with psycopg.connect(dsn, autocommit=True) as conn:
        killed = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE pid = ANY(%s)", [held]).fetchone()
    assert killed and killed[0] >= 1
    statuses, peak = _burst(base, token, dsn, before)
    assert statuses == [200] * 96
    assert peak <= POOL


def test_no_free_connection_is_a_503_with_retry_after_not_a_server_error(
        world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """When every pooled connection stays busy for DB_POOL_TIMEOUT (an overloaded process),
    the request is answered 503 with Retry-After — JSON under /api/, a bare page elsewhere (the
    portal's own pages need the database) — so clients and proxies back off and retry; before,
    the open-loop benchmark at 100 requests a second got 5,490 "Server error" 500s. Any other
    database failure is still a 500."""
    from django.db import OperationalError
    from django.test import Client
    from psycopg_pool import PoolTimeout

    from tenants.api.exceptions import BUSY_RETRY_AFTER_S

    _, token = tenant_services.token_create(actor=world.a.member, name="busy")
    api = Client(raise_request_exception=False, HTTP_AUTHORIZATION=f"Bearer {token}")
    portal = Client(raise_request_exception=False)
    portal.force_login(world.a.member)

    def no_connection(*args: Any, **kwargs: Any) -> None:
        # What Django raises when psycopg_pool's getconn() times out: its OperationalError
        # wrapping the PoolTimeout (django.db.utils.DatabaseErrorWrapper).
        try:
            raise PoolTimeout("couldn't get a connection after 10.00 sec")
        except PoolTimeout as exc:
            raise OperationalError(str(exc)) from exc

    wrapper = type(connections["default"])  # the backend's class: the proxy takes no patches back
    monkeypatch.setattr(wrapper, "ensure_connection", no_connection)
    busy = api.get("/api/v1/jobs/")
    assert busy.status_code == 503 and busy["Retry-After"] == str(BUSY_RETRY_AFTER_S)
    assert busy.json()["detail"].startswith("The server is busy")
    page = portal.get("/dashboard/")
    assert page.status_code == 503 and page["Retry-After"] == str(BUSY_RETRY_AFTER_S)
    assert b"Camp is busy" in page.content

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(wrapper, "ensure_connection", broken)
    failed = api.get("/api/v1/jobs/")
    assert failed.status_code == 500 and "Retry-After" not in failed


def test_readyz_answers_503_at_once_while_the_pool_cannot_connect(transactional_db: Any,
                                                                  tmp_path: Path) -> None:
    """A pooled web process started before its database role exists (compose starts web
    beside ``migrate``, which creates it) answers /readyz 503 naming the cause at once, not
    after the pool's timeout (here 600 s: the probe would time out first, and a kubelet's
    readinessProbe waits 5 s); once the role can log in and read the migrations, 200 on the
    next probe (both checks on the probe's own connection, not the pool's)."""
    dsn = _dsn()
    connection.ensure_connection()
    before = _server_backends(dsn, set())
    role = f"camp_late_{os.getpid()}"
    late = f"postgres://{role}:pw@{dsn.split('@', 1)[1]}"
    with _uvicorn(tmp_path, late, before, owner=dsn, DB_POOL_TIMEOUT="600") as base:
        down = requests.get(f"{base}/readyz", timeout=60)
        assert down.status_code == 503
        assert down.json()["checks"]["database"] == "unreachable (OperationalError)"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
            conn.execute(f"GRANT SELECT ON django_migrations TO {role}")
        try:
            up = requests.get(f"{base}/readyz", timeout=60)
            assert up.status_code == 200, up.json()
            assert up.json()["checks"]["database"] == "ok" and up.json()["checks"]["migrations"] == "ok"
        finally:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE usename = %s", [role])
                conn.execute(f"REVOKE ALL ON django_migrations FROM {role}")
                conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_readyz_answers_on_the_pools_own_connection_when_no_new_one_can_be_opened(
        transactional_db: Any, tmp_path: Path) -> None:
    """At PostgreSQL's connection limit, a probe that opened a connection of its own failed,
    and so every web pod was marked unready at once while their pools held working
    connections. Here the server's role may hold exactly the pool's 2 connections
    (``CONNECTION LIMIT``). The first probe, before the pool is open, checks on a connection
    of its own and sees the migrations applied. Once the pool holds both connections, a new
    connection is refused and /readyz still answers 200, on an idle pooled connection. The
    server holds no more than the pool's connections. Before the change it answered 503:
    "unreachable (OperationalError)"."""
    dsn = _dsn()
    connection.ensure_connection()
    before = _server_backends(dsn, set())
    role = f"camp_full_{os.getpid()}"
    full = f"postgres://{role}:pw@{dsn.split('@', 1)[1]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT {POOL}")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}")
    try:
        with _uvicorn(tmp_path, full, before, owner=dsn, DB_POOL_MIN_SIZE=str(POOL)) as base:
            first = requests.get(f"{base}/readyz", timeout=60)  # its own connection: 1 of 2
            assert first.status_code == 200, first.json()
            # Any request that reads the database opens the pool, which fills to its minimum.
            unknown = {"Authorization": f"Bearer {TOKEN_PREFIX}unknown"}  # looked up: 401
            assert requests.get(f"{base}/api/v1/jobs/", headers=unknown, timeout=60).status_code == 401
            deadline = time.monotonic() + 60
            while len(_server_backends(dsn, before)) < POOL:
                assert time.monotonic() < deadline, (
                    f"the pool did not open its minimum: {_server_backends(dsn, before)}\n"
                    + (tmp_path / "web.log").read_text()[-3000:])
                time.sleep(0.1)
            with pytest.raises(psycopg.OperationalError, match="too many connections"):
                psycopg.connect(full, autocommit=True).close()  # what a probe of its own met
            for _ in range(5):
                ready = requests.get(f"{base}/readyz", timeout=60)
                assert ready.status_code == 200, ready.json()
                checks = ready.json()["checks"]
                assert checks["database"] == "ok" and checks["migrations"] == "ok", checks
            assert len(_server_backends(dsn, before)) == POOL
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role])
            conn.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
