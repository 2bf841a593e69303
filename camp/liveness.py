"""Liveness of the processes without an HTTP port: beat and the watchers.

Each marks a file in ``CAMP_LIVENESS_DIR`` (default ``/tmp``, writable in every container)
whenever its main loop makes progress: the beat at each scheduler tick
(``camp.beat.LivenessScheduler``), a watcher at each event, each renewed watch window and
each retry (``camp_watch``). A probe — Kubernetes' exec liveness probe, compose's
healthcheck — runs ``python -m camp.liveness ROLE --max-age SECONDS``, which exits 1 when
the mark is older than that (a stalled loop: a wedged beat, a hung watch stream), so the
kubelet or Docker restarts the process. Stdlib only: the probe must not load Django.

The worker's liveness is ``celery inspect ping`` to its own node (a round trip through the
broker to its consumer), written once in ``WORKER_PROBE`` below and used by the chart and
compose alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

MAX_AGE_SECONDS = {"beat": 120, "watcher": 900}
"""Default staleness per role. beat ticks at least every few seconds (the scheduler tick is
3 s); a watcher renews its watch every --window (300 s) plus the client's 5-s read timeout
and marks on every event, so 900 s is three silent windows."""

WORKER_PROBE = 'exec celery -A camp inspect ping --destination "celery@$HOSTNAME" --timeout 10'
"""The worker's liveness command (sh -c): its own node answers a ping through the broker."""

_MARK_INTERVAL_SECONDS = 1.0
_marked_at: dict[str, float] = {}


def path(role: str) -> Path:
    return Path(os.environ.get("CAMP_LIVENESS_DIR", "/tmp")) / f"camp-{role}.alive"  # noqa: S108


def mark(role: str) -> None:
    """Record progress now (at most once a second; never raises: a full disk must not stop
    the loop, and the probe then reports the stale mark)."""
    now = time.monotonic()
    if now - _marked_at.get(role, -_MARK_INTERVAL_SECONDS) < _MARK_INTERVAL_SECONDS:
        return
    _marked_at[role] = now
    target = path(role)
    try:
        target.touch()
        os.utime(target)
    except OSError:
        pass


def age(role: str) -> float | None:
    """Seconds since the last mark, or None if the process never marked."""
    try:
        return max(0.0, time.time() - path(role).stat().st_mtime)
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m camp.liveness",
                                     description="Exit 1 when ROLE's loop stopped making progress.")
    parser.add_argument("role", choices=sorted(MAX_AGE_SECONDS))
    parser.add_argument("--max-age", type=float, default=None,
                        help="Seconds a mark stays fresh (default: per role).")
    args = parser.parse_args(argv)
    limit = args.max_age if args.max_age is not None else MAX_AGE_SECONDS[args.role]
    seconds = age(args.role)
    if seconds is None:
        print(f"{args.role}: no liveness mark at {path(args.role)}", file=sys.stderr)
        return 1
    if seconds > limit:
        print(f"{args.role}: last progress {seconds:.0f} s ago (limit {limit:.0f} s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
