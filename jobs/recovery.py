"""The jobs side of automatic recovery (clusters/recovery.py calls it through register_hook; jobs → clusters).

    stop(cluster, recovery)   before the failed nodes are stopped and replaced: jobs that failed because
                              the node died (Ray saw the ranks die before the watch degraded the cluster,
                              within VOLT_RECOVERY_FAILED_WINDOW_S of the detection) are taken back as
                              INTERRUPTED; what is left of every interrupted job is stopped (through Ray
                              when the head answers, and its processes killed on every host)
    resume(cluster, recovery) once the cluster is READY again: each interrupted job is resubmitted with
                              VOLT_RESUME_FROM = its last synchronized checkpoint (rescanned first: a
                              checkpoint written during the failure, shards without a manifest, is never
                              chosen); steps lost = the last step it logged − the step resumed from

GPU-hours lost per recovery and job = the cluster's GPUs × (detection → resubmission + steps lost × the
job's mean step time); gpu_hours_lost(job) sums them over every recovery of the job.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.utils import timezone

from clusters.models import Recovery
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
        gpus = int((cluster.spec or {}).get("nodes") or 0) * int(
            (cluster.spec or {}).get("gpus_per_node") or 0
        )
        for job in services.jobs_to_resume(cluster):
            checkpoint = services.latest_synchronized_checkpoint(job)
            job.refresh_from_db()
            last = job.last_step
            step = checkpoint.step if checkpoint else 0
            lost = max(0, (last or 0) - step)
            job = services.resubmit_job(job, resume_from=checkpoint.path if checkpoint else None)
            now = timezone.now()
            step_s = _mean_step_s(job, recovery)
            downtime_s = (now - recovery.detected_at).total_seconds()
            hours = gpus * (downtime_s + lost * step_s) / 3600
            resumed.append({
                "job": job.pk, "name": job.name, "attempt": job.attempt, "last_step": last,
                "checkpoint_step": checkpoint.step if checkpoint else None,
                "checkpoint_path": checkpoint.path if checkpoint else None, "steps_lost": lost,
                "gpu_hours_lost": round(hours, 4), "resumed_at": now.isoformat(),
            })  # fmt: skip
            services.note(job, f"resumed by recovery from step {step} ({lost} step(s) lost)")
        return resumed


def _mean_step_s(job: Job, recovery: Recovery) -> float:
    if not job.first_step_at or not job.last_step:
        return 0.0
    return max(0.0, (recovery.detected_at - job.first_step_at).total_seconds() / max(1, job.last_step))


def gpu_hours_lost(job: Job) -> float:
    """GPU-hours this job lost to failures, over every recovery of its cluster that resumed it."""
    total = 0.0
    for jobs in Recovery.objects.filter(cluster_id=job.cluster_id).values_list("jobs", flat=True):
        total += sum(entry.get("gpu_hours_lost") or 0 for entry in jobs if entry.get("job") == job.pk)
    return round(total, 4)


HOOK = JobsRecovery()
