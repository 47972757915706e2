"""Stopping a job (through Ray, then every host checked by the job's process marker) and what jobs do when
their cluster ends or degrades (registered in clusters/hooks.py by jobs/apps.py)."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from clusters.choices import ClusterStatus
from clusters.models import Cluster
from clusters.provisioning import ray_nodes
from clusters.tenancy import (
    node_driver,
    ray_cluster_id,
)
from inventory.drivers.base import DriverError
from jobs import following, onray, transitions
from jobs.choices import LIVE, TERMINAL, WAITING, JobStatus
from jobs.models import Job
from jobs.workdirs import (
    prune_working_dir,
)
from voltweb.statemachine import IllegalTransition
from voltweb.taskutils import enqueue_on_commit

logger = logging.getLogger(__name__)
S = JobStatus


def stop_job(job: Job, *, reason: str = "", wait: bool = False, actor: AbstractBaseUser | None = None) -> Job:
    """Stop a job: one never submitted ends at once; a submitted one is stopped through Ray by a worker
    (stop_job_task; `wait=True` does it in this call), which checks every host for its processes.
    Raises IllegalTransition for a job that already ended."""
    reason = reason or f"stopped by {actor or 'Volt'}"
    job.refresh_from_db()
    if job.status in TERMINAL:
        raise IllegalTransition(job, job.status, S.STOPPED)
    if not job.ray_submission_id and job.status == S.PENDING:
        stopped = Job.objects.filter(pk=job.pk).update(stop_requested_at=timezone.now())
        if stopped:
            return transitions.transition(job, S.STOPPED, reason, extra={"finished_at": timezone.now(),
                                                                         "status_reason": reason})  # fmt: skip
    Job.objects.filter(pk=job.pk).update(stop_requested_at=timezone.now(), status_reason=reason[:2000])
    job.stop_requested_at = timezone.now()
    transitions.note(job, f"stop requested: {reason}")
    if wait:
        return finish_stop(job.pk, reason)
    enqueue_on_commit("jobs.tasks.stop_job_task", job.pk, reason)
    return job


def finish_stop(job_id: int, reason: str) -> Job:
    """Ask Ray to stop the job, wait for it, make sure none of its processes is left on any host (killing
    leftovers), store the last logs, then STOPPED (unless it had ended by itself meanwhile)."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    problems = []
    if job.ray_submission_id:
        problems += stop_through_ray(job, settings.VOLT_JOB_STOP_TIMEOUT_S)
    problems += ensure_processes_gone(job)
    if job.ray_submission_id:
        try:
            following.poll_now(job)  # the last lines (and the status Ray ended with)
        except Exception:  # noqa: BLE001 - logs are best effort next to the stop
            logger.warning("job %s: last poll after stop failed", job.pk, exc_info=True)
    job.refresh_from_db()
    if job.status in LIVE | WAITING:
        detail = f"; {'; '.join(problems)}" if problems else ""
        job = transitions.transition(job, S.STOPPED, reason + detail, extra={
            "finished_at": timezone.now(), "status_reason": (reason + detail)[:2000]})  # fmt: skip
    elif problems:
        transitions.note(job, "; ".join(problems))
    return job


def stop_through_ray(job: Job, timeout_s: float) -> list[str]:
    try:
        client = onray.ray_client(job.cluster)
        client.stop_job(job.ray_submission_id)
        deadline = time.monotonic() + timeout_s
        while not client.get_job_status(job.ray_submission_id).is_terminal():
            if time.monotonic() > deadline:
                return [f"Ray did not stop it within {timeout_s:g} s"]
            time.sleep(0.5)
    except (RuntimeError, OSError, ValueError, ConnectionError) as exc:
        return [f"Ray's stop failed ({str(exc)[:200]})"]
    return []


def job_processes_by_host(job: Job, *, kill: bool = False) -> dict[str, list[int]]:
    """PIDs of the job's processes per host name (every active node of its cluster)."""
    found = {}
    for node in onray.live_nodes(job.cluster):
        with node_driver(node.host) as driver:
            found[node.host.name] = ray_nodes.job_processes(
                driver, ray_cluster_id(job.cluster), onray.job_marker(job), kill=kill
            )
    return found


def ensure_processes_gone(job: Job, timeout_s: float | None = None) -> list[str]:
    """Wait (bounded) until no process of the job runs on any host; kill what is left. Problems, or []."""
    deadline = time.monotonic() + (timeout_s or settings.VOLT_JOB_STOP_TIMEOUT_S)
    problems: list[str] = []
    for node in onray.live_nodes(job.cluster):
        try:
            with node_driver(node.host) as driver:
                args = (driver, ray_cluster_id(job.cluster), onray.job_marker(job))
                while ray_nodes.job_processes(*args) and time.monotonic() < deadline:
                    time.sleep(0.5)
                killed = ray_nodes.job_processes(*args)
                if killed:
                    left = ray_nodes.job_processes(*args, kill=True)
                    problems.append(f"killed {len(killed)} leftover process(es) on {node.host.name}")
                    if left:
                        problems.append(f"{len(left)} process(es) still on {node.host.name}: {left}")
        except (DriverError, ValueError) as exc:
            problems.append(f"could not check {node.host.name}: {str(exc)[:200]}")
    return problems


# --- the cluster's lifecycle (clusters/hooks.py) ------------------------------------------------------


def stop_cluster_jobs(cluster: Cluster) -> None:
    """Before a terminated cluster's processes stop: its jobs are stopped through Ray (briefly: the
    teardown that follows stops every process anyway) and end STOPPED with the reason."""
    for job in Job.objects.filter(cluster=cluster, status__in=LIVE | WAITING).select_related("cluster"):
        reason = f"its cluster {cluster.name} was terminated"
        Job.objects.filter(pk=job.pk).update(stop_requested_at=timezone.now(), status_reason=reason)
        job.refresh_from_db()
        problems = stop_through_ray(job, 10.0) if job.ray_submission_id else []
        if job.ray_submission_id:
            try:
                following.poll_now(job)
            except Exception:  # noqa: BLE001 - the logs are best effort here
                pass
        job.refresh_from_db()
        if job.status in LIVE | WAITING:
            detail = f" ({'; '.join(problems)})" if problems else ""
            transitions.transition(job, S.STOPPED, reason + detail,
                                   extra={"finished_at": timezone.now(), "status_reason": reason})  # fmt: skip


def cluster_status_changed(cluster: Cluster, previous: str, target: str, reason: str) -> None:
    """DEGRADED interrupts the cluster's running jobs (recovery resumes them); a failed cluster fails them,
    an ended one stops what is left."""
    moves = {
        ClusterStatus.DEGRADED: (LIVE, S.INTERRUPTED, f"its cluster went degraded: {reason}"),
        ClusterStatus.FAILED: (LIVE | WAITING, S.FAILED, f"its cluster failed: {reason}"),
        ClusterStatus.TERMINATED: (LIVE | WAITING, S.STOPPED, "its cluster was terminated"),
    }
    if target not in moves:
        return
    sources, to, why = moves[target]
    for job in Job.objects.filter(cluster=cluster, status__in=sources):
        try:
            transitions.transition(job, to, why[:2000], extra={
                "status_reason": why[:2000], **({} if to == S.INTERRUPTED else {"finished_at": timezone.now()})})  # fmt: skip
        except IllegalTransition:
            continue  # it ended meanwhile
    if target in (ClusterStatus.FAILED, ClusterStatus.TERMINATED):
        ended = list(Job.objects.filter(cluster=cluster).values_list("pk", flat=True))
        transaction.on_commit(lambda: _prune_working_dirs(ended))


def _prune_working_dirs(job_ids: list[int]) -> None:
    """The working dir copies of a cluster's jobs, once it is gone (nothing can submit them again)."""
    for job_id in job_ids:
        prune_working_dir(job_id)
