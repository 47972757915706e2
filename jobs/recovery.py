"""The jobs side of automatic recovery (clusters/recovery.py calls it through register_hook; jobs → clusters).

    stop(cluster, recovery)   before the failed nodes are stopped and replaced: jobs that failed because
                              the node died (Ray saw the ranks die before the watch degraded the cluster,
                              within VOLT_RECOVERY_FAILED_WINDOW_S of the detection) are taken back as
                              INTERRUPTED; what is left of every interrupted job is stopped (through Ray
                              when the head answers, and its processes killed on every host)
    resume(cluster, recovery) once the cluster is READY again: each interrupted job is resubmitted with
                              VOLT_RESUME_FROM = its last synchronized checkpoint (rescanned first: a
                              checkpoint written during the failure, shards without a manifest, is never
                              chosen); steps lost = the last step it reached (its step and checkpoint
                              events: services.steps_reached) − the step resumed from, a lower bound
                              unless it logs every step

clusters/recovery.py turns each row into GPU-hours lost (the cluster's GPUs × (detection → the job
stepped again + its lost steps × its mean step time)); gpu_hours_lost(job) sums them over every recovery
of the job. When a resubmitted attempt logs its first step, services.apply_events tells the recovery.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import Max, OuterRef, QuerySet, Subquery, Sum
from django.utils import timezone

from clusters.models import Recovery, RecoveryJob
from jobs import services, transitions
from jobs.choices import JobStatus
from jobs.models import Job
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
S = JobStatus


def _window_s() -> float:
    return getattr(settings, "VOLT_RECOVERY_FAILED_WINDOW_S", 3 * settings.VOLT_WATCH_INTERVAL_S + 30)


class JobsRecovery:
    def stop(self, cluster, recovery: Recovery) -> None:
        since = recovery.detected_at - timezone.timedelta(seconds=_window_s())
        for job in Job.objects.filter(cluster=cluster, status=S.FAILED, finished_at__gte=since):
            try:
                transitions.transition(job, S.INTERRUPTED, f"failed as its cluster lost a node ({recovery.cause})"[:2000],
                                       extra={"finished_at": None, "status_reason": ""})  # fmt: skip
            except IllegalTransition:
                continue
        for job in services.jobs_to_resume(cluster):
            services.note(job, f"recovery of its cluster: stopping what is left of attempt {job.attempt}")
            if job.ray_submission_id:
                try:
                    services.ray_client(cluster).stop_job(job.ray_submission_id)
                except Exception:  # noqa: BLE001 - the head may be the node that died
                    pass
            problems = services.ensure_processes_gone(job, timeout_s=5.0)
            if problems:
                services.note(job, "; ".join(problems))

    def resume(self, cluster, recovery: Recovery) -> list[dict]:
        resumed = []
        for job in services.jobs_to_resume(cluster):
            checkpoint = services.latest_synchronized_checkpoint(job)
            job.refresh_from_db()
            reached = services.steps_reached(job, recovery.detected_at)
            last = reached["last_step"]
            step = checkpoint.step if checkpoint else 0
            lost = max(0, (last or 0) - step)
            lower_bound = reached["is_lower_bound"]
            job = services.resubmit_job(job, resume_from=checkpoint.path if checkpoint else None,
                                        from_step=checkpoint.step if checkpoint else None)  # fmt: skip
            resumed.append({
                "job": job.pk, "name": job.name, "attempt": job.attempt, "last_step": last,
                "checkpoint_step": checkpoint.step if checkpoint else None,
                "checkpoint_path": checkpoint.path if checkpoint else None, "steps_lost": lost,
                "steps_lost_is_lower_bound": lower_bound, "step_s": reached["step_s"],
                "resubmitted_at": timezone.now().isoformat(), "training_resumed_at": None,
            })  # fmt: skip
            services.note(
                job, f"resubmitted by recovery from step {step} ({steps_lost_phrase(lost, lower_bound)})"
            )
        return resumed


def steps_lost_phrase(lost: int, lower_bound: bool) -> str:
    """ "3 step(s) lost", "at least 3 step(s) lost", or, when the job logged no step past its checkpoint but
    may have stepped on, that (never "at least 0")."""
    if lower_bound and lost == 0:
        return "no step logged past it; the steps since its last log line may be lost"
    return f"{'at least ' if lower_bound else ''}{lost} step(s) lost"


def gpu_hours_lost(job: Job) -> float:
    """GPU-hours this job lost to failures, over every recovery that resubmitted it (its RecoveryJob rows)."""
    if hasattr(job, "recovery_gpu_hours"):  # annotated by lists: with_gpu_hours_lost()
        total = job.recovery_gpu_hours
    else:
        total = RecoveryJob.objects.filter(job_id=job.pk).aggregate(total=Sum("gpu_hours_lost"))["total"]
    return round(total or 0.0, 4)


def step_reached_before(job: Job) -> int | None:
    """The highest step an earlier attempt of the job reached (its recoveries' records), or None: a
    resubmitted job restarts from its checkpoint's step, so its own `last_step` says where it is now, not
    how far it had come."""
    if job.attempt <= 1:
        return None
    return RecoveryJob.objects.filter(job_id=job.pk).aggregate(top=Max("last_step"))["top"]


def with_gpu_hours_lost(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """`jobs` annotated with `recovery_gpu_hours` (what gpu_hours_lost reads) in the same query."""
    per_job = (
        RecoveryJob.objects.filter(job_id=OuterRef("pk"))
        .order_by()
        .values("job_id")
        .annotate(total=Sum("gpu_hours_lost"))
        .values("total")
    )
    return jobs.annotate(recovery_gpu_hours=Subquery(per_job))


HOOK = JobsRecovery()
