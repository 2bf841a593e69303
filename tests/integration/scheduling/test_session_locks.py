"""A session-level advisory lock (one cycle per cluster, one placement step, one dispatch per
job: ``scheduling.services.common.session_lock``) is never carried on by a connection whose
release failed. With the connection pool (the default), that connection would go back to the
pool still holding the lock, and every other worker would find the cluster "busy", or wait
for the job's dispatch, for as long as the connection lives. Real PostgreSQL; the lock is seen
from a session of its own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from django.db import DatabaseError, connection, connections, transaction

from scheduling.models import Job
from scheduling.services import common

pytestmark = pytest.mark.django_db(transaction=True)

KEY_CLASS, KEY = common._DISPATCH_LOCK_CLASS, 987_654_321


@contextlib.contextmanager
def _observer() -> Iterator[object]:
    other = connections.create_connection("default")
    try:
        yield other
    finally:
        other.close()


def _held(observer: object) -> bool:
    with observer.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                       "AND classid = %s AND objid = %s AND objsubid = 2", [KEY_CLASS, KEY])
        return bool(cursor.fetchone()[0])


@pytest.fixture(autouse=True)
def _release_after() -> Iterator[None]:
    yield
    with connection.cursor() as cursor:  # whatever a failing run left behind
        cursor.execute("SELECT pg_advisory_unlock_all()")


@pytest.mark.parametrize("wait", [False, True], ids=["try (cycle, placement)", "wait (dispatch)"])
def test_a_lock_whose_release_fails_is_not_kept_by_the_connection(wait: bool) -> None:
    with _observer() as observer:
        with pytest.raises(DatabaseError):
            with transaction.atomic(), common.session_lock(KEY_CLASS, KEY, wait=wait) as got:
                assert got and _held(observer)
                # A statement fails and the caller goes on: its transaction is aborted, so
                # the release on leaving cannot run in this session.
                with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                    cursor.execute("SELECT 1 / 0")
        assert not _held(observer), "the lock outlived its holder's failed release"
        assert Job.objects.count() >= 0  # the next use of the database works: a new session
        with common.session_lock(KEY_CLASS, KEY) as again:
            assert again  # free for the next holder


def test_a_lock_is_released_on_leaving_and_a_second_holder_is_refused_meanwhile() -> None:
    with _observer() as observer:
        with common.session_try_lock(KEY_CLASS, KEY) as got:
            assert got and _held(observer)
            with observer.cursor() as cursor:  # type: ignore[attr-defined]
                cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", [KEY_CLASS, KEY])
                assert cursor.fetchone()[0] is False
        assert not _held(observer)
