"""``camp.pgtypes``: timestamps read through psycopg's C loader are the values Django's own
loader gives, on the suite's real PostgreSQL, and the connections Django hands out use it."""

from __future__ import annotations

import datetime

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import BaseTzLoader

from camp import pgtypes

pytestmark = pytest.mark.django_db

VALUES = ("2026-12-03 13:42:14.160806+00", "2026-01-01 10:00:00.123456+05", "1999-12-31 23:59:59-08:30",
          "0001-01-01 00:00:00+00", "9999-12-31 23:59:59.999999+00", "2024-02-29 12:00:00+14",
          "1970-01-01 00:00:00+00", "2026-03-29 02:30:00+01")


def _read(loader: type) -> list[datetime.datetime | None]:
    raw = connection.connection
    raw.adapters.register_loader("timestamptz", loader)
    with raw.cursor() as cur:
        cur.execute("SELECT v::timestamptz FROM unnest(%s::text[]) AS v UNION ALL SELECT NULL",
                    [list(VALUES)])
        return [r[0] for r in cur.fetchall()]


def test_the_c_loader_reads_what_djangos_loader_reads() -> None:
    connection.ensure_connection()
    fast = pgtypes.utc_loader_class()
    assert fast is not None, "psycopg's C implementation is pinned (psycopg[binary])"

    class Djangos(BaseTzLoader):
        timezone = datetime.UTC

    try:
        theirs, ours = _read(Djangos), _read(fast)
    finally:
        connection.close()  # the next test gets a connection set up as Django sets it
    assert ours == theirs
    assert all(v is None or v.tzinfo is datetime.UTC for v in ours)
    assert ours[1] == datetime.datetime(2026, 1, 1, 5, 0, 0, 123456, tzinfo=datetime.UTC)


def test_djangos_connections_read_timestamps_through_the_c_loader() -> None:
    from django.contrib.auth import get_user_model

    connection.ensure_connection()
    from psycopg.pq import Format

    loader = connection.connection.adapters.get_loader(pgtypes.TIMESTAMPTZ_OID, Format.TEXT)
    assert loader.__name__ == "UtcTimestamptzLoader"
    # and Django's cursors keep it (its create_cursor compares the loader's time zone)
    user = get_user_model().objects.create_user("clock", password="x")
    joined = get_user_model().objects.values_list("date_joined", flat=True).get(pk=user.pk)
    assert joined.tzinfo is datetime.UTC
    assert abs((joined - user.date_joined).total_seconds()) < 1e-6
