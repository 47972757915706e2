"""Job statuses, with the sets code uses instead of literals (jobs/transitions.py moves between them)."""

from django.db import models


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"
    INTERRUPTED = "interrupted", "Interrupted"


S = JobStatus
# Submitted (or about to be) and not ended: what the poller follows and a stop can act on.
LIVE = {S.PENDING, S.RUNNING}
# Waiting for recovery (issue 14): its cluster went DEGRADED. Still polled for logs and checkpoints.
WAITING = {S.INTERRUPTED}
TERMINAL = {S.SUCCEEDED, S.FAILED, S.STOPPED}
# Ray's job statuses (ray.job_submission.JobStatus values) and what Volt makes of them.
FROM_RAY = {
    "PENDING": S.PENDING,
    "RUNNING": S.RUNNING,
    "SUCCEEDED": S.SUCCEEDED,
    "FAILED": S.FAILED,
    "STOPPED": S.STOPPED,
}
