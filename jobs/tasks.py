"""Thin Celery tasks for jobs (queue `jobs`): load by id, call a service."""

from django.conf import settings

from jobs import services
from voltweb.taskutils import volt_task


@volt_task("jobs", soft_time_limit=110, time_limit=120)
def start_job_task(job_id: int) -> str:
    """Submit a PENDING job's current attempt to its cluster's Ray head (idempotent)."""
    return services.start_job(job_id).status


@volt_task("jobs", soft_time_limit=20, time_limit=30)
def poll_jobs_task() -> int:
    """Fan out: one poll per followed job, each expiring after one interval; re-queue lost submissions."""
    ids = services.polled_job_ids()
    for job_id in ids:
        poll_job_task.apply_async((job_id,), expires=settings.VOLT_JOB_POLL_S * 2)
    services.requeue_stuck_submissions()
    return len(ids)


@volt_task("jobs", soft_time_limit=50, time_limit=60)
def poll_job_task(job_id: int) -> str:
    """Status, new logs, events and checkpoints of one job."""
    return services.poll_job(job_id)


@volt_task("jobs", soft_time_limit=150, time_limit=180)
def stop_job_task(job_id: int, reason: str) -> str:
    """Stop a job through Ray and make sure none of its processes is left on any host."""
    return services.finish_stop(job_id, reason).status
