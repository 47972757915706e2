"""The job lifecycle: one table of allowed moves and transition(), as clusters/transitions.py."""

from __future__ import annotations

from jobs.choices import JobStatus
from jobs.models import Job, JobEvent
from jobs.payloads import job_payload
from jobs.workdirs import prune_working_dir
from voltweb import realtime, statemachine

S = JobStatus
JOB_TRANSITIONS: dict[str, dict[str, str]] = {
    S.PENDING: {
        S.RUNNING: "Ray started the job's entrypoint",
        S.SUCCEEDED: "finished between two polls",
        S.FAILED: "submission refused, or the entrypoint failed at once",
        S.STOPPED: "stopped before it ran",
        S.INTERRUPTED: "its cluster went degraded",
    },
    S.RUNNING: {
        S.SUCCEEDED: "the entrypoint exited 0",
        S.FAILED: "the entrypoint exited non-zero (or Ray lost it)",
        S.STOPPED: "stopped on request, or its cluster was terminated",
        S.INTERRUPTED: "its cluster went degraded",
    },
    S.INTERRUPTED: {
        S.PENDING: "resubmitted by recovery",
        S.FAILED: "recovery impossible",
        S.STOPPED: "stopped on request, or its cluster was terminated",
    },
    S.SUCCEEDED: {},
    # Recovery (jobs/recovery.py): a job whose ranks died with a node can fail (Ray saw it first) before the
    # watch degrades its cluster; recovery takes it back as interrupted, then resumes it.
    S.FAILED: {S.INTERRUPTED: "it failed when its cluster lost a node; recovery resumes it"},
    S.STOPPED: {},
}
FINAL = {status for status, moves in JOB_TRANSITIONS.items() if not moves}  # succeeded, stopped


def transition(
    job: Job, to: str, reason: str = "", extra: dict | None = None, where: dict | None = None
) -> Job:
    """Move `job` to `to` from an allowed status (else IllegalTransition), with a timeline event; the
    cluster's page hears of it after commit. `where`: what the stored row must still say (statemachine.apply)."""

    def record(previous: str, target: str) -> None:
        JobEvent.objects.create(
            job=job,
            from_status=previous,
            to_status=target,
            message=reason or JOB_TRANSITIONS[previous][target],
        )

    def announce() -> None:
        realtime.broadcast(
            f"cluster-{job.cluster_id}", {"kind": "job", "job": job_payload(job), "reason": reason}
        )
        if to in FINAL:
            prune_working_dir(job.pk)  # nothing submits a succeeded or stopped job again

    return statemachine.apply(job, to, JOB_TRANSITIONS, field="status", extra=extra, record=record,
                              after_commit=announce, where=where)  # fmt: skip


def announce(job: Job) -> None:
    realtime.broadcast(f"cluster-{job.cluster_id}", {"kind": "job", "job": job_payload(job)})


def note(job: Job, message: str) -> None:
    """A timeline line of the job that is not a status change."""
    JobEvent.objects.create(job=job, message=message)
