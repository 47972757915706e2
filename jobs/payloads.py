"""A job as websocket events and the cluster page's live rows carry it: built from the row alone (no query)."""

from __future__ import annotations

from jobs.models import Job


def job_payload(job: Job) -> dict:
    """A job as websocket events carry it (no query)."""
    when = lambda value: value.isoformat() if value else None  # noqa: E731
    return {
        "id": job.pk,
        "cluster": job.cluster_id,
        "name": job.name,
        "status": job.status,
        "status_reason": job.status_reason,
        "attempt": job.attempt,
        "ray_submission_id": job.ray_submission_id,
        "last_step": job.last_step,
        "first_step_at": when(job.first_step_at),
        "started_at": when(job.started_at),
        "finished_at": when(job.finished_at),
        "log_size": job.log_size,
        "url": f"/clusters/{job.cluster_id}/jobs/{job.pk}/",
        "resume_from": job.resume_from,
    }
