"""A worker that lost Redis must not exit on the reconnect (kombu 5.7.0 / celery 5.7.0).

The defect (reproduced in docs/RELIABILITY.md, "Worker exits after a Redis reconnect"):
kombu's Redis ``Channel.close()`` first reads the reply of a BRPOP still in flight, so that
a message Redis popped for it is not lost (kombu PR #1733). When the broker is gone that
read raises a connection error and ``close()`` stops there: the channel that holds the
worker's unacknowledged (late-ack) messages stays open. Celery's reconnect path
(``Consumer.on_connection_error_after_connected``) calls ``connection.collect()``, which
swallows that error, gives up on the remaining channels if one of them fails too (Redis still
down) and detaches the transport from its connection (``transport.client = None``); Celery
5.7.0 then also calls ``connection.close()``, which closes that channel a second time: with
no pending read left it goes on, drops its Redis pools and restores the unacked messages through a new pool,
built from ``transport.client.hostname`` -> ``AttributeError: 'NoneType' object has no
attribute 'hostname'``. That is not a connection error, so Celery logs "Unrecoverable error"
and the worker process exits. It happens when the loss is noticed on another socket first
while the task channel's BRPOP is outstanding (seen: the remote-control subscription; from the
code, gossip's subscription or a failed ack could do the same).

The fix: a failed read of that pending reply no longer aborts ``close()``. A reply that did
arrive is still read and delivered first (what kombu PR #1733 protects); when the read fails
the connection is dead and there is nothing more to read. The channel then closes in
``collect()`` while its transport is intact, restoring (or, Redis down, failing to restore)
its unacked messages exactly as a channel without a pending read does, and Celery's second
close is a no-op. No released kombu or celery has a fix (5.7.0 is the newest of both on
2026-11-26), and no setting avoids the path without giving something up:
``worker_enable_remote_control=False`` removes the trigger seen (``celery inspect``/``control``
and ``app.control.ping`` go with it) but gossip's subscription would be another. Remove this
module when kombu's ``Channel.close`` tolerates the failed read (check:
``tests/integration/reliability/test_redis_reconnect.py`` without it).
"""

from __future__ import annotations

from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis

_close = kombu_redis.Channel.close


def _close_after_failed_read(self: Any) -> None:
    if self._in_poll:
        try:
            self._brpop_read()  # resets _in_poll whatever it raises
        except Empty:
            pass
        except self.connection_errors:
            pass  # the broker is gone: nothing to drain; close the channel all the same
    _close(self)


if not getattr(kombu_redis.Channel.close, "camp_patched", False):
    _close_after_failed_read.camp_patched = True  # type: ignore[attr-defined]
    kombu_redis.Channel.close = _close_after_failed_read  # type: ignore[method-assign]
