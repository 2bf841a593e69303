"""PostgreSQL ``timestamptz`` values read through psycopg's C loader (issue 35).

Django's psycopg 3 backend registers, on every connection, a loader for ``timestamptz`` that
subclasses psycopg's *pure-Python* ``TimestamptzLoader`` and then replaces the result's tzinfo
with Django's time zone (``psycopg_any.BaseTzLoader``). psycopg's C loader (``psycopg[binary]``,
which we pin) cannot be subclassed, so Django's subclass loses it: every timestamp read costs
~3.5 µs instead of ~0.4 µs, and a jobs page reads ~500 of them.

When Django's time zone and the connection's are both UTC (our settings: ``TIME_ZONE = "UTC"``,
``USE_TZ = True``; Django sets the session's ``TimeZone`` to it on connect), the C loader's
answer is already what Django's gives: the instant converted to the session's zone, with
``datetime.timezone.utc`` as its tzinfo (``tests/integration/test_pgtypes.py`` compares the two on a
real server). This module puts the C loader's ``load`` behind a class that carries the
``timezone`` attribute Django reads when it opens a cursor (``DatabaseWrapper.create_cursor``
registers its own loader again only when that attribute disagrees). For any other time zone
Django's loader stays.

Written by hand because neither Django nor psycopg offers it: Django's loader is built per time
zone inside the backend, and psycopg's C class is final.
"""

from __future__ import annotations

import datetime
import functools
from typing import Any

from django.db.backends.signals import connection_created

TIMESTAMPTZ_OID = 1184


def _c_loader() -> type | None:
    """psycopg's C ``timestamptz`` text loader, or None without the C implementation."""
    import psycopg
    from psycopg.pq import Format

    loader = psycopg.adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT)
    return loader if loader is not None and loader.__module__.startswith(("psycopg_binary", "psycopg_c")) \
        else None


@functools.cache
def utc_loader_class() -> type | None:
    """The loader class to register, built once (None when psycopg has no C implementation
    here)."""
    from psycopg.adapt import Loader

    found = _c_loader()
    if found is None:
        return None
    c_loader: type = found

    class UtcTimestamptzLoader(Loader):
        """psycopg's C loader, with the ``timezone`` Django compares (always UTC here)."""

        timezone = datetime.UTC

        def __init__(self, oid: int, context: Any = None) -> None:
            super().__init__(oid, context)
            # the C loader's bound method as this instance's ``load``: psycopg calls it per
            # value with no Python frame of ours in between
            self.load = c_loader(oid, context).load  # type: ignore[method-assign]

        def load(self, data: Any) -> Any:  # replaced per instance in __init__
            raise NotImplementedError

    return UtcTimestamptzLoader


def _use_c_loader(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created``: register the C-backed loader on a PostgreSQL connection whose
    session and Django time zones are UTC (each time Django takes it, pooled or new)."""
    if connection.vendor != "postgresql" or connection.timezone is not datetime.UTC \
            or connection.timezone_name != "UTC":
        return
    adapters = getattr(connection.connection, "adapters", None)
    loader = utc_loader_class()
    if adapters is None or loader is None:  # psycopg2, or no C implementation: Django's stays
        return
    from psycopg.pq import Format

    if adapters.get_loader(TIMESTAMPTZ_OID, Format.TEXT) is not loader:
        adapters.register_loader("timestamptz", loader)


def install() -> None:
    """Called once from ``CampConfig.ready``."""
    connection_created.connect(_use_c_loader, dispatch_uid="camp.pgtypes.c_timestamptz")
