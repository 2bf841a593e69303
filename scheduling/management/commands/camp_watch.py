"""``manage.py camp_watch --cluster NAME``: the long-running watch consumer.

Streams the cluster's pod events (list, then watch from the list's resourceVersion;
reconnects on a dropped stream and relists on 410 Gone — ``KubernetesBackend.watch_pods``)
and applies each through ``services.pod_event_apply``, so phase changes reach jobs within
moments instead of at the next periodic reconcile. The periodic reconcile task stays the
safety net (e.g. for pods deleted while the stream was away: a relist reports what exists,
not what vanished). One process per cluster; docker-compose runs it as ``watcher``.

It never dies on one bad event (the error is recorded and the next event applied), and
during an API server outage it backs off quietly: exponential waits capped at a minute,
one log line when the watch fails and one when it recovers, not one per retry. Its health
(last event, current error and since when) is stored on the cluster: the console's cluster
page and /metrics show it.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connection

from camp import liveness, logs
from scheduling import services
from scheduling.backends import backend_for
from scheduling.backends.base import BackendError, PodStatus
from scheduling.models import WATCH_HEARTBEAT_SECONDS, Cluster

logger = logging.getLogger("scheduling.watch")

MAX_BACKOFF_SECONDS = 60.0
HEALTH_WRITE_SECONDS = 5.0
"""The last event's time is written at most this often (not once per event)."""


class Health:
    """The watcher's state as the cluster row shows it (``watch_last_event_at``, and the last
    error with its time: failing while that error is newer than the last event); logs only
    when it changes."""

    def __init__(self, cluster_id: int, name: str) -> None:
        self.cluster_id, self.name = cluster_id, name
        self.error = ""
        self.written_at = 0.0

    def event(self) -> None:
        now = time.monotonic()
        if self.error:
            logger.info("watch of %s recovered", self.name)
            self.error = ""
            # The API server answers again: end the reconcile's backoff now (its next try
            # could be minutes away after a long outage), so the next tick reconciles.
            services.cluster_reachability_record(cluster_id=self.cluster_id, error=None)
        elif now - self.written_at < HEALTH_WRITE_SECONDS:
            return
        Cluster.objects.filter(pk=self.cluster_id).update(watch_last_event_at=_now())
        self.written_at = now

    def failed(self, message: str, *, exc_info: bool = False) -> None:
        message = message[:500]
        if message == self.error:
            return  # the same problem again: already logged and shown
        self.error = message
        logger.warning("watch of %s: %s", self.name, message, exc_info=exc_info)
        Cluster.objects.filter(pk=self.cluster_id).update(watch_error=message,
                                                          watch_error_since=_now())


def _heartbeat(name: str) -> threading.Event:
    """Write the cluster's ``watch_heartbeat_at`` now and every ``WATCH_HEARTBEAT_SECONDS``
    from a thread, until the returned event is set: health follows its age
    (``Cluster.watch_healthy``), so a killed watcher reads unhealthy within
    ``WATCH_HEARTBEAT_STALE_SECONDS``, with or without pod events."""
    done = threading.Event()

    def beat() -> None:
        Cluster.objects.filter(name=name).update(watch_heartbeat_at=_now())

    beat()

    def run() -> None:
        try:
            while not done.wait(WATCH_HEARTBEAT_SECONDS):
                try:
                    beat()
                except Exception:  # noqa: BLE001 (the database away: the next beat tries again)
                    close_old_connections()
        finally:
            connection.close()

    threading.Thread(target=run, name="camp-watch-heartbeat", daemon=True).start()
    return done


def _external_sync(name: str, seconds: float) -> threading.Event:
    """Every ``seconds``, from a thread until the returned event is set: the cluster's waiting
    pods that name Camp's scheduler become external jobs, and say why they wait
    (``services.external_pods_sync``, issue 34). A failed pass is logged and the next tries again."""
    done = threading.Event()

    def run() -> None:
        failing = ""
        try:
            while not done.wait(seconds):
                try:
                    cluster = Cluster.objects.filter(name=name).first()
                    if cluster is not None:
                        services.external_pods_sync(cluster=cluster)
                    failing = ""
                except Exception as exc:  # noqa: BLE001 (the next pass tries again)
                    close_old_connections()
                    if str(exc) != failing:
                        failing = str(exc)
                        logger.warning("external pods of %s: %s", name, exc, exc_info=True)
        finally:
            connection.close()

    threading.Thread(target=run, name="camp-watch-external", daemon=True).start()
    return done


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


class _Stopped(BaseException):  # noqa: N818 — not an error: the stop signal's way out
    """Raised by the SIGTERM/SIGINT handler to leave a blocking read at once (a
    BaseException, so that no ``except Exception`` on the way swallows it)."""


class Command(BaseCommand):
    help = "Stream a cluster's pod events and apply them to jobs (runs until stopped)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--cluster", required=True, help="Cluster name.")
        parser.add_argument("--window", type=int, default=300,
                            help="Seconds per watch request before it is renewed (default 300).")
        parser.add_argument("--max-events", type=int, default=0,
                            help="Stop after this many events (0: never; for tests and debugging).")
        parser.add_argument("--duration", type=float, default=0,
                            help="Stop after this many seconds (0: never).")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            with logs.bound(cluster=options["cluster"]):  # on each of its log lines
                self._handle(**options)
        except _Stopped:
            logger.info("camp_watch of %s stopped by a signal", options["cluster"])

    def _handle(self, **options: Any) -> None:
        name = options["cluster"]
        stop = {"now": False, "applying": False}

        def _stop(signum: int, frame: Any) -> None:
            # Promptly: the watch blocks in a socket read (up to --window seconds) or a
            # retry's sleep; raising here ends that wait at once (PEP 475 retries a system
            # call only when the handler returns). An event being applied finishes first.
            stop["now"] = True
            if not stop["applying"]:
                raise _Stopped

        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[sig] = signal.signal(sig, _stop)
            except ValueError:  # not the main thread (tests): stop via --max-events/--duration
                pass
        # The client's connection pool logs every retry of a dead server (several lines a
        # second); the watcher reports the outage itself, once.
        logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
        deadline = time.monotonic() + options["duration"] if options["duration"] else None
        logger.info("camp_watch of %s starting (watch window %d s, liveness mark %s)",
                    name, options["window"], liveness.path("watcher"))
        beating = _heartbeat(name)
        every = float(getattr(settings, "CAMP_EXTERNAL_SYNC_SECONDS", 5))
        external = _external_sync(name, every) if every > 0 else None
        try:
            self._loop(name, options, stop, deadline)
        finally:
            beating.set()
            # Run in-process (call_command in tests, a shell), the handlers must not outlive
            # the command: a later SIGTERM would raise _Stopped in unrelated code.
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if external is not None:
                external.set()

    def _loop(self, name: str, options: dict[str, Any], stop: dict[str, bool],
              deadline: float | None) -> None:
        max_events = options["max_events"]
        seen = 0
        backoff = 1.0
        health: Health | None = None

        def pause(seconds: float) -> None:
            end = time.monotonic() + seconds
            if deadline is not None:
                end = min(end, deadline)
            while not stop["now"] and time.monotonic() < end:
                liveness.mark("watcher")  # waiting on purpose is progress
                time.sleep(min(0.2, max(0.0, end - time.monotonic())))

        while not stop["now"] and (deadline is None or time.monotonic() < deadline):
            liveness.mark("watcher")  # each window, retry and disabled-cluster wait
            if not connection.in_atomic_block:  # a long-lived process: drop dead connections
                close_old_connections()
            cluster = Cluster.objects.filter(name=name).first()
            if cluster is None:
                raise CommandError(f"No cluster named {name!r}.")
            if health is None:
                health = Health(cluster.pk, cluster.name)
            if not cluster.enabled:
                pause(5)
                continue
            window = options["window"]
            if deadline is not None:
                window = max(1, min(window, int(deadline - time.monotonic()) + 1))
            pods: dict[str, PodStatus] = {}  # rebuilt by each window's initial list
            try:
                for event in backend_for(cluster).watch_pods(timeout_seconds=window):
                    liveness.mark("watcher")
                    try:
                        stop["applying"] = True
                        outcome = services.pod_event_watch_apply(cluster=cluster, event=event,
                                                                 pods=pods)
                    except Exception as exc:  # noqa: BLE001 (one bad event must not stop the watch)
                        if not connection.in_atomic_block:
                            close_old_connections()
                        health.failed(f"applying {event.type} {event.pod.name} failed: "
                                      f"{type(exc).__name__}: {exc}", exc_info=True)
                        continue
                    finally:
                        stop["applying"] = False
                    health.event()
                    logger.debug("%s %s %s (%s): %s", cluster.name, event.type, event.pod.name,
                                 event.pod.phase, outcome)
                    seen += 1
                    if (max_events and seen >= max_events) or stop["now"] or (
                            deadline is not None and time.monotonic() >= deadline):
                        return
                backoff = 1.0
            except BackendError as exc:
                health.failed(f"{exc}; retrying with backoff (at most {MAX_BACKOFF_SECONDS:.0f} s)")
                pause(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
