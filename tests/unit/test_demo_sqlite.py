"""The demo's SQLite settings: a launch (read, then write, in one transaction) never fails with
"database is locked" because the worker wrote in between (issue 32, finding 1).

Two real connections of Django's SQLite backend on one file, configured exactly as
``camp.settings.database`` configures the demo's."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from django.db import connections
from django.db.backends.sqlite3.base import DatabaseWrapper
from django.db.transaction import atomic

from camp.settings.database import SQLITE_OPTIONS


def _connection(path: Path, alias: str) -> DatabaseWrapper:
    settings = {
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(path), "OPTIONS": dict(SQLITE_OPTIONS),
        "ATOMIC_REQUESTS": False, "AUTOCOMMIT": True, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False,
        "TIME_ZONE": None, "USER": "", "PASSWORD": "", "HOST": "", "PORT": "", "TEST": {},
    }
    return DatabaseWrapper(settings, alias)


def test_a_read_then_write_transaction_waits_for_the_other_writer(tmp_path: Path,
                                                                  django_db_blocker: Any) -> None:
    with django_db_blocker.unblock():  # our own SQLite file, not the suite's database
        _launch_races_worker(tmp_path)


def _launch_races_worker(tmp_path: Path) -> None:
    db = tmp_path / "demo.sqlite3"
    web = _connection(db, "web")
    with web.cursor() as c:
        c.execute("CREATE TABLE job (id INTEGER PRIMARY KEY, who TEXT)")
    assert web.cursor().execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    worker_error: list[BaseException] = []

    def worker_writes() -> None:  # the load generator's write, while the launch is under way
        try:
            worker = _connection(db, "worker")  # its own process in the demo; a thread here
            with worker.cursor() as c:
                c.execute("INSERT INTO job (who) VALUES ('worker')")
            worker.close()
        except BaseException as exc:  # noqa: BLE001 (reported to the test thread)
            worker_error.append(exc)

    connections["web"] = web  # atomic() finds connections by alias (thread-local)
    try:
        with atomic(using="web"), web.cursor() as c:  # environment_launch's transaction
            c.execute("SELECT count(*) FROM job")  # the launch reads (quota, presets)...
            thread = threading.Thread(target=worker_writes)
            thread.start()
            thread.join(timeout=1)  # ...the worker writes meanwhile (or waits for the launch)
            c.execute("INSERT INTO job (who) VALUES ('web')")  # ...then the launch writes
    finally:
        del connections["web"]
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert not worker_error, worker_error
    rows = sorted(r[0] for r in web.cursor().execute("SELECT who FROM job").fetchall())
    assert rows == ["web", "worker"]
    web.close()
