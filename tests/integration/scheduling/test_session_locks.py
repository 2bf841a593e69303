"""A session-level advisory lock (one cycle per cluster, one placement step, one dispatch per
job: ``scheduling.services.common.session_lock``) is never carried on by a connection whose
release failed. With the connection pool (the default), that connection would go back to the
pool still holding the lock, and every other worker would find the cluster "busy", or wait
for the job's dispatch, for as long as the connection lives. Real PostgreSQL; the lock is seen
from a session of its own. A session that ends releases its locks as its backend exits, a
moment later, so the checks wait for that (up to 30 s) rather than assume it is instant."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, connections, transaction

from scheduling.models import Job
from scheduling.services import common
from tests.integration.deploy.test_connection_pool import _dsn
from tests.integration.deploy.tools import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

KEY_CLASS, KEY = common._DISPATCH_LOCK_CLASS, 987_654_321
HELD = ("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
        "AND classid = %s AND objid = %s AND objsubid = 2")


@contextlib.contextmanager
def _observer() -> Iterator[Any]:
    other = connections.create_connection("default")
    try:
        yield other
    finally:
        other.close()


def _held(observer: Any) -> bool:
    with observer.cursor() as cursor:
        cursor.execute(HELD, [KEY_CLASS, KEY])
        return bool(cursor.fetchone()[0])


def _freed(observer: Any) -> bool:
    deadline = time.monotonic() + 30
    while _held(observer):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(autouse=True)
def _release_after() -> Iterator[None]:
    yield
    with connection.cursor() as cursor:  # whatever a failing run left behind
        cursor.execute("SELECT pg_advisory_unlock_all()")


def _abort_the_transaction() -> None:
    # A statement fails and the caller goes on: its transaction is aborted, so the release
    # on leaving cannot run in this session.
    with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")


@pytest.mark.parametrize("wait", [False, True], ids=["try (cycle, placement)", "wait (dispatch)"])
def test_a_lock_whose_release_fails_is_not_kept_by_the_connection(wait: bool) -> None:
    with _observer() as observer:
        with pytest.raises(DatabaseError):  # the failed release itself: nothing else went wrong
            with transaction.atomic(), common.session_lock(KEY_CLASS, KEY, wait=wait) as got:
                assert got and _held(observer)
                _abort_the_transaction()
        assert _freed(observer), "the lock outlived its holder's failed release"
        assert Job.objects.count() >= 0  # the next use of the database works: a new session
        with common.session_lock(KEY_CLASS, KEY, wait=True) as again:
            assert again and _held(observer)  # the next holder takes it
        assert _freed(observer)


def test_the_callers_own_error_is_what_it_sees_and_the_lock_still_goes() -> None:
    with _observer() as observer:
        with pytest.raises(ValueError, match="the caller's"):
            with transaction.atomic(), common.session_try_lock(KEY_CLASS, KEY) as got:
                assert got
                _abort_the_transaction()
                raise ValueError("the caller's own error")
        assert _freed(observer)


def test_a_lock_is_released_on_leaving_and_a_second_holder_is_refused_meanwhile() -> None:
    with _observer() as observer:
        with common.session_try_lock(KEY_CLASS, KEY) as got:
            assert got and _held(observer)
            with observer.cursor() as cursor:
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [KEY_CLASS, KEY])
                assert cursor.fetchone()[0] is False
        assert not _held(observer)  # unlocked by its own session: at once


POOLED = """
import contextlib, time
import django
django.setup()
from django.db import DatabaseError, connection, transaction
from scheduling.services import common
from tests.integration.scheduling.test_session_locks import HELD, KEY, KEY_CLASS
assert connection.pool is not None, "no pool"
try:
    with transaction.atomic(), common.session_lock(KEY_CLASS, KEY) as got:
        assert got
        with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
except DatabaseError:
    pass
deadline = time.monotonic() + 30
while True:  # from the pool's connections, as the next task on this process would be
    with connection.cursor() as cursor:
        cursor.execute(HELD, [KEY_CLASS, KEY])
        held = cursor.fetchone()[0]
    connection.close()
    if not held:
        print("freed")
        break
    if time.monotonic() > deadline:
        print("still held")
        break
    time.sleep(0.05)
"""


def test_with_the_pool_the_session_is_discarded_not_given_back() -> None:
    """The default deployment: a process with a pool (the suite's own process has none). Its
    later database work, on the pool's connections, finds the lock free."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "camp.settings.test", "DATABASE_URL": _dsn(),
           "CAMP_TEST_RUN_ID": str(settings.TEST_RUN_ID), "DB_POOL_MAX_SIZE": "2"}
    done = subprocess.run([sys.executable, "-c", POOLED], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "freed", done.stdout + done.stderr[-2000:]
