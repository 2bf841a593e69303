"""``make demo`` starts its worker again when it exits while the demo serves (a worker that died
left the pages up and nothing scheduled, issue 32), says so, and stopping the demo stops it."""

from __future__ import annotations

import os
import signal
import sys
import time

from portal.management.commands.rundemo import _Supervisor


def test_a_worker_that_dies_is_started_again_and_stopped_with_the_demo() -> None:
    said: list[str] = []
    sup = _Supervisor([sys.executable, "-c", "import time; time.sleep(120)"], dict(os.environ), said.append)
    first = sup.start()
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    assert said and said[0].startswith("The Celery worker exited (code -9); started again"), said
    assert sup.proc is not None
    second = sup.proc.pid
    assert second != first and sup.proc.poll() is None  # the new worker runs
    sup.stop()
    assert sup.proc.poll() is not None  # reaped: stopped with the demo, not started a third time
    time.sleep(0.2)
    assert len(said) == 1, said
