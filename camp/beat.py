"""The beat's scheduler: Celery's own, marking its liveness at every tick (camp/liveness.py)."""

from __future__ import annotations

from typing import Any

from celery.beat import PersistentScheduler

from camp import liveness


class LivenessScheduler(PersistentScheduler):
    """``PersistentScheduler`` whose every tick is a liveness mark: a beat whose loop stalls
    (a hung broker publish, a blocked schedule file) stops marking and its probe fails."""

    def tick(self, *args: Any, **kwargs: Any) -> float:
        liveness.mark("beat")
        return float(super().tick(*args, **kwargs))
