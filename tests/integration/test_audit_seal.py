"""The audit chain sealed after commit (issue 13): writers insert events without waiting for
one another; one sealer at a time chains what has committed. Real PostgreSQL, real
concurrent connections (one per thread), commits for real (``transaction=True``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, connections, transaction

from tenants.audit import audit_batch, audit_record, request_seal, seal, unsealed_count, verify_chain
from tenants.models import AuditEvent
from tenants.tasks import audit_seal

pytestmark = pytest.mark.django_db(transaction=True)


def _in_thread(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` on this thread's own database connection, closed afterwards."""
    def run() -> None:
        try:
            fn()
        finally:
            connections.close_all()
    return run


def _chain() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(chain_seq__isnull=False).order_by("chain_seq"))


def test_an_event_is_sealed_when_its_transaction_commits() -> None:
    with transaction.atomic():
        event = audit_record(actor=None, action="test.one")
        event.refresh_from_db()
        assert event.hash is None and event.chain_seq is None  # not before the commit
    event.refresh_from_db()
    assert event.hash and event.prev_hash and event.chain_seq
    assert not list(verify_chain(seal_first=False))


def test_concurrent_writers_all_end_up_in_one_valid_chain() -> None:
    """Eight connections write 40 transactions each (one to three events, some batched), all
    at once: nobody waits for a chain lock, and every event ends up sealed exactly once in
    one chain that verifies, each transaction's events in the order recorded."""
    start = threading.Barrier(8)

    def writer(w: int) -> Callable[[], None]:
        def write() -> None:
            start.wait()
            for t in range(40):
                n = 1 + (w + t) % 3
                if t % 2:
                    with transaction.atomic(), audit_batch():
                        for i in range(n):
                            audit_record(actor=None, action=f"test.w{w}.t{t}.{i}")
                else:
                    with transaction.atomic():
                        for i in range(n):
                            audit_record(actor=None, action=f"test.w{w}.t{t}.{i}")
        return _in_thread(write)

    with ThreadPoolExecutor(max_workers=8) as pool:
        for future in [pool.submit(writer(w)) for w in range(8)]:
            future.result()
    total = AuditEvent.objects.count()
    assert total == sum(1 + (w + t) % 3 for w in range(8) for t in range(40))
    audit_seal()  # the beat task: whatever a lost race left (usually nothing)
    assert unsealed_count() == 0
    chain = _chain()
    assert len(chain) == total
    assert [e.chain_seq for e in chain] == list(range(chain[0].chain_seq, chain[0].chain_seq + total))
    assert chain[0].prev_hash == "0" * 64
    assert all(b.prev_hash == a.hash for a, b in zip(chain, chain[1:], strict=False))
    assert not list(verify_chain(seal_first=False))
    # Each transaction's events keep the order they were recorded in (other transactions'
    # events may sit between them: nobody holds the chain while writing).
    by_txn: dict[str, list[AuditEvent]] = {}
    for event in chain:
        by_txn.setdefault(event.action.rsplit(".", 1)[0], []).append(event)
    for events in by_txn.values():
        assert [e.pk for e in events] == sorted(e.pk for e in events)
        assert [e.action.rsplit(".", 1)[1] for e in events] == [str(i) for i in range(len(events))]


def test_a_transaction_that_commits_late_is_chained_after_those_that_committed_first() -> None:
    """Ids are taken at insert, commits come in another order: the late one is not lost and
    not slipped in before rows already chained."""
    inserted, release = threading.Event(), threading.Event()

    def slow() -> None:
        with transaction.atomic():
            audit_record(actor=None, action="test.slow")
            inserted.set()
            assert release.wait(10)

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_in_thread(slow))
        assert inserted.wait(10)
        fast = audit_record(actor=None, action="test.fast")  # commits (and seals) first
        fast.refresh_from_db()
        assert fast.chain_seq is not None
        release.set()
        pending.result()
    slow_event = AuditEvent.objects.get(action="test.slow")
    assert slow_event.pk < fast.pk
    assert slow_event.chain_seq is not None and slow_event.chain_seq > fast.chain_seq
    assert slow_event.prev_hash == fast.hash
    assert not list(verify_chain(seal_first=False))


def _sql(statement: str, params: list[object]) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_the_database_lets_a_row_be_sealed_once_and_nothing_else() -> None:
    with transaction.atomic():
        event = audit_record(actor=None, action="test.sealing")
        # Sealing while changing the content: refused.
        with pytest.raises(DatabaseError, match="append-only"):
            _sql("UPDATE tenants_auditevent SET action = 'x', prev_hash = %s, hash = %s, chain_seq = 1"
                 " WHERE id = %s", ["0" * 64, "1" * 64, event.pk])
        # Half a seal: refused.
        with pytest.raises(DatabaseError, match="append-only"):
            _sql("UPDATE tenants_auditevent SET hash = %s WHERE id = %s", ["1" * 64, event.pk])
    event.refresh_from_db()
    assert event.hash is not None and event.action == "test.sealing"
    # Re-sealing a sealed row (to hide an edit): refused.
    with pytest.raises(DatabaseError, match="append-only"):
        _sql("UPDATE tenants_auditevent SET hash = %s WHERE id = %s", ["2" * 64, event.pk])


def test_verify_without_sealing_reports_what_waits_and_checks_the_rest() -> None:
    audit_record(actor=None, action="test.sealed")
    with transaction.atomic():
        audit_record(actor=None, action="test.waiting")
        out = StringIO()
        call_command("audit_verify", "--no-seal", stdout=out)
        assert "1 events verified; 1 committed since, not sealed yet" in out.getvalue()
        out = StringIO()
        call_command("audit_verify", stdout=out)  # seals it, then verifies both
        assert "2 events verified (1 sealed just now)" in out.getvalue()
    assert seal() == 0


def test_a_large_transaction_is_sealed_by_the_worker_not_by_its_writer() -> None:
    """A cycle's or a bulk submit's events (more than ``SEAL_INLINE_MAX``) are sealed by the
    ``audit_seal`` task, run here by a real Celery worker, so the writer does not wait."""
    import time

    from django.core.cache import cache

    from tenants.audit import SEAL_INLINE_MAX, SEAL_QUEUED_KEY
    from tests.integration.scheduling.test_concurrency import celery_worker

    cache.delete(SEAL_QUEUED_KEY)
    with transaction.atomic(), audit_batch():
        for i in range(SEAL_INLINE_MAX + 1):
            audit_record(actor=None, action=f"test.large.{i}")
    # Committed: the writer sealed nothing and asked for the task.
    assert unsealed_count() == SEAL_INLINE_MAX + 1
    assert cache.get(SEAL_QUEUED_KEY)
    with celery_worker():  # (it purges the queue at start: ask again, as the beat would)
        cache.delete(SEAL_QUEUED_KEY)
        request_seal()
        deadline = time.monotonic() + 30
        while unsealed_count() and time.monotonic() < deadline:
            time.sleep(0.2)
    assert unsealed_count() == 0
    chain = _chain()
    assert [e.action for e in chain] == [f"test.large.{i}" for i in range(SEAL_INLINE_MAX + 1)]
    assert not list(verify_chain(seal_first=False))


def _raw(statement: str, params: list[object]) -> None:
    """As a database superuser would: with the triggers switched off."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(statement, params)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")


INSERT = ("INSERT INTO tenants_auditevent (created_at, actor_username, action, target_type, target_id,"
          " target_repr, request_id, prev_hash, hash, chain_seq)"
          " VALUES (now(), 'x', %s, '', '', '', '', %s, %s, %s)")


def test_rows_outside_the_chain_are_named_and_do_not_stop_sealing() -> None:
    """A half-sealed row is refused on insert; one forced in (triggers off) is never sealed,
    does not stop the sealing of the others, and verification names it — as it names a
    forged row carrying a hash but no place in the chain."""
    with pytest.raises(DatabaseError, match="wholly unsealed or wholly sealed"), transaction.atomic():
        _sql(INSERT, ["test.half", "0" * 64, None, None])
    audit_record(actor=None, action="test.before")
    _raw(INSERT, ["test.half", "0" * 64, None, None])
    _raw(INSERT, ["test.forged", "0" * 64, "f" * 64, None])
    after = audit_record(actor=None, action="test.after")
    after.refresh_from_db()
    assert after.chain_seq is not None  # sealing went on past the half-sealed row
    half = AuditEvent.objects.get(action="test.half").pk
    forged = AuditEvent.objects.get(action="test.forged").pk
    assert {b.event_id for b in verify_chain()} == {half, forged}
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=f"event #{half}: its chain columns are only partly set"):
        call_command("audit_verify", stdout=StringIO())


def test_a_writer_that_finds_the_chain_locked_asks_the_task_and_a_lone_writer_seals_in_one_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After its commit a single write runs one sealing pass: one short transaction of three
    statements (lock; unsealed rows carrying the chain's tail; update), which chains each write
    after the one before. If another process holds the chain lock (it may have read the
    unsealed rows before this commit), the writer does not wait and does not leave its rows to
    the beat: it queues the ``audit_seal`` task, which seals them."""
    from django.core.cache import cache
    from django.test.utils import CaptureQueriesContext

    from tenants.audit import _CHAIN_LOCK_KEY, SEAL_QUEUED_KEY

    published: list[dict[str, object]] = []
    publish = audit_seal.apply_async

    def counted(*args: object, **kwargs: object) -> object:
        published.append(kwargs)
        return publish(*args, **kwargs)

    monkeypatch.setattr(audit_seal, "apply_async", counted)
    cache.delete(SEAL_QUEUED_KEY)
    with CaptureQueriesContext(connection) as ctx:
        with transaction.atomic():
            audit_record(actor=None, action="test.alone")
    sql = [q["sql"] for q in ctx.captured_queries
           if q["sql"].split(" ")[0] not in ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE")]
    seal_sql = [s for s in sql if "advisory" in s]
    assert len(seal_sql) == 1, seal_sql  # one pass (there were two)
    assert len(sql[sql.index(seal_sql[0]):]) == 3, sql  # the tail read with the rows (there were 4)
    assert unsealed_count() == 0 and cache.get(SEAL_QUEUED_KEY) is None and not published
    for n in range(2):  # each lone write chains after the last sealed row (the tail it read)
        with transaction.atomic():
            audit_record(actor=None, action=f"test.chained.{n}")
        assert unsealed_count() == 0
    first, second = AuditEvent.objects.filter(action__startswith="test.chained.").order_by("id")
    assert (second.chain_seq, second.prev_hash) == (first.chain_seq + 1, first.hash)
    assert list(verify_chain(seal_first=False)) == []

    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold_the_chain() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CHAIN_LOCK_KEY])
            held.set()
            release.wait(60)
        done.set()

    sealer = threading.Thread(target=_in_thread(hold_the_chain))
    sealer.start()
    try:
        assert held.wait(60)
        with transaction.atomic():
            audit_record(actor=None, action="test.while-locked")
        assert unsealed_count() == 1  # not sealed: the lock was held, the writer did not wait
        assert cache.get(SEAL_QUEUED_KEY) and published == [{"retry": False}]  # … it queued the task
    finally:
        release.set()
        sealer.join(60)
    assert done.is_set()
    audit_seal()  # what the queued task runs
    assert unsealed_count() == 0
    assert [e.action for e in _chain()][-4:] == [
        "test.alone", "test.chained.0", "test.chained.1", "test.while-locked"]
    assert not list(verify_chain(seal_first=False))
