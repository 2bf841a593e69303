"""Signals the scheduler sends for observers (metrics, live pages); receivers must not raise."""

from django.dispatch import Signal

# sent after each completed cycle: cluster_id, seconds, admitted, waiting, rejected, preempting
cycle_finished = Signal()
# sent when creating a job's pods failed: cluster_id, job_id, message
dispatch_failed = Signal()
# sent after decisions were inserted in bulk (bulk inserts send no post_save): job_ids
decisions_recorded = Signal()
