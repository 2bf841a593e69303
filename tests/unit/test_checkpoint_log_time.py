"""A checkpoint line as the real kubelet stamps it (RFC 3339 with nanoseconds) is read and
dated; the scan crashed on it before (``%f`` takes at most six digits), so a job on a real
cluster never had a checkpoint recorded and a preempted run started from scratch."""

from __future__ import annotations

import datetime as dt

from workspaces.services.training import CHECKPOINT_LINE, _log_time


def test_the_kubelets_nanosecond_timestamp_dates_the_checkpoint() -> None:
    m = CHECKPOINT_LINE.match("2026-11-28T03:07:42.664896684Z CAMP_CHECKPOINT step=5 path=/ckpt/step-5.pt")
    assert m is not None and (m.group(2), m.group(3)) == ("5", "/ckpt/step-5.pt")
    assert _log_time(m.group(1)) == dt.datetime(2026, 11, 28, 3, 7, 42, 664896, tzinfo=dt.UTC)


def test_microseconds_whole_seconds_and_nonsense() -> None:
    assert _log_time("2026-11-28T03:07:42.5Z") == dt.datetime(2026, 11, 28, 3, 7, 42, 500000, tzinfo=dt.UTC)
    assert _log_time("2026-11-28T03:07:42Z") == dt.datetime(2026, 11, 28, 3, 7, 42, tzinfo=dt.UTC)
    assert _log_time("yesterdayZ") is None
