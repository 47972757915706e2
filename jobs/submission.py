"""Submitting a job: who may, what is valid, the working dir, the Ray submission by a worker, and the
resubmission recovery asks for."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from clusters.choices import ClusterStatus
from clusters.models import Cluster
from jobs import onray, stopping, transitions
from jobs.choices import JobStatus
from jobs.models import Job, JobEvent, JobLogChunk
from jobs.workdirs import (
    JobInputError,
    prepare_working_dir,
)
from voltweb import services as accounts
from voltweb.domain import DomainError

logger = logging.getLogger(__name__)
S = JobStatus
MAX_ENV_VARS = 64
MAX_ENTRYPOINT = 2000
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = ("VOLT_", "RAY_")  # Volt's contract with the job, and Ray's own switches
RESERVED_NAMES = {"CUDA_VISIBLE_DEVICES", "GLOO_SOCKET_IFNAME", "LD_PRELOAD"}
SUBMITTABLE = {ClusterStatus.READY}


class ClusterNotReady(DomainError):
    """Jobs go to READY clusters only (API: 409)."""

    code = "cluster_not_ready"


class SubmitRefused(DomainError, PermissionError):
    """The caller may not run code on this cluster; `code` names the rule, `status` the HTTP answer."""

    code = "team_members_only"
    status = 403


def check_may_submit(cluster: Cluster, user: AbstractBaseUser | None) -> None:
    """Raise SubmitRefused unless `user` is a member of the cluster's team (`None`: Volt itself).

    A job runs with the cluster's Ray token and reads and writes its shared storage, which Volt withholds
    from platform admins (no token in their hand-off, 403 on the key download): they see jobs, stop them
    and terminate clusters, but submitting code is for the team's members only. The API, the console form
    and the CLI all come through here."""
    if user is None or accounts.is_team_member(user, cluster.team):
        return
    raise SubmitRefused(
        f"Only members of {cluster.team.name} submit jobs to its clusters: a job runs with the cluster's "
        "Ray token and storage. Platform admins see, stop and terminate, but do not run code on a team's "
        "cluster."
    )


# --- the demo workload -------------------------------------------------------------------------------


def demo_entrypoint(
    steps: int = 60, checkpoint_every: int = 10, seed: int = 0, step_sleep: float = 0.0
) -> str:
    """The demo's command line (jobs/workloads/demo_train.py, run in its own folder)."""
    command = f"python demo_train.py --steps {int(steps)} --checkpoint-every {int(checkpoint_every)} --seed {int(seed)}"
    return command + (f" --step-sleep {float(step_sleep):g}" if step_sleep else "")


DEMO_ENTRYPOINT = demo_entrypoint()


# --- who sees what --------------------------------------------------------------------------------


def visible_jobs(user: AbstractBaseUser) -> QuerySet[Job]:
    """Jobs on the clusters the caller sees (Cluster.objects.visible_to): another team's is a 404."""
    return Job.objects.filter(cluster__in=Cluster.objects.visible_to(user))


# --- submit ------------------------------------------------------------------------------------------


def validate_env(env: Any) -> dict[str, str]:
    """The caller's environment variables as str → str; JobInputError says which one is wrong and why."""
    if env in (None, ""):
        return {}
    if not isinstance(env, dict):
        raise JobInputError('env must be an object of names to values, e.g. {"LR": "0.1"}.')
    if len(env) > MAX_ENV_VARS:
        raise JobInputError(f"env has {len(env)} variables; at most {MAX_ENV_VARS}.")
    clean = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise JobInputError(f"env: {str(name)[:60]!r} is not a variable name (letters, digits, _).")
        if name.startswith(RESERVED_ENV) or name in RESERVED_NAMES:
            raise JobInputError(f"env: {name} is set by Volt or Ray for every job; choose another name.")
        if not isinstance(value, str):
            # Environment variables are strings: a number's text is the caller's to write (0.1 or 0.10?),
            # and a float arrives as Python prints it (1e-05), which is rarely what was meant.
            example = (
                json.dumps(str(value))
                if isinstance(value, int | float) and not isinstance(value, bool)
                else '"..."'
            )
            raise JobInputError(f"env: {name} must be a string, not {type(value).__name__}: write {example}.")
        if len(value) > 4096 or "\x00" in value:
            raise JobInputError(f"env: {name} is longer than 4096 characters or holds a NUL byte.")
        clean[name] = value
    return clean


def validate_entrypoint(entrypoint: Any) -> str:
    if not isinstance(entrypoint, str) or not entrypoint.strip():
        raise JobInputError("entrypoint is empty: give the command to run, e.g. `python train.py`.")
    if len(entrypoint) > MAX_ENTRYPOINT or "\x00" in entrypoint:
        raise JobInputError(f"entrypoint must be at most {MAX_ENTRYPOINT} characters, without NUL bytes.")
    return entrypoint.strip()


def submit_job(
    cluster: Cluster,
    user: AbstractBaseUser | None,
    entrypoint: str,
    *,
    working_dir: str | Path | None = None,
    env: dict | None = None,
    checkpoint_every: int = 10,
    name: str = "",
    is_demo: bool = False,
) -> Job:
    """Create a PENDING job on a READY cluster and queue its submission to Ray (after commit).

    `working_dir`: a folder on Volt's machine shipped with the job (copied, with volt_ckpt.py added);
    None ships a folder holding only volt_ckpt.py. Raises SubmitRefused (not a member of the cluster's
    team), JobInputError (bad input) or ClusterNotReady.
    """
    check_may_submit(cluster, user)
    entrypoint = validate_entrypoint(entrypoint)
    env = validate_env(env)
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool) or checkpoint_every < 1:
        raise JobInputError("checkpoint_every must be a whole number of steps, 1 or more.")
    if working_dir is not None and not Path(working_dir).is_dir():
        raise JobInputError(f"working dir {working_dir} is not a folder.")
    cluster.refresh_from_db(fields=["status"])
    if cluster.status not in SUBMITTABLE:
        raise ClusterNotReady(
            f"Cluster {cluster.name} is {cluster.status}: jobs go to ready clusters. Wait until it is ready "
            "(volt clusters wait ID) or request a new one."
        )
    with transaction.atomic():
        job = Job.objects.create(
            cluster=cluster,
            team_id=cluster.team_id,
            created_by=user if user is not None and user.is_authenticated else None,
            name=(name or ("demo" if is_demo else entrypoint.split()[-1]))[:100],
            entrypoint=entrypoint,
            env=env,
            checkpoint_every=checkpoint_every,
            is_demo=is_demo,
        )
        job.working_dir = str(prepare_working_dir(job, Path(working_dir) if working_dir else None))
        job.save(update_fields=["working_dir"])
        JobEvent.objects.create(
            job=job, to_status=S.PENDING, message=f"submitted by {user or 'Volt'}: {entrypoint}"
        )
        transitions.announce(job)
        onray.queue_start(job.pk)
    return job


def start_job(job_id: int) -> Job:
    """Submit a PENDING job's current attempt to Ray (the task body). Idempotent."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    if job.status != S.PENDING or job.ray_submission_id or job.stop_requested_at:
        return job
    if not job.cluster.dashboard_url:
        return transitions.transition(job, S.FAILED, "its cluster has no Ray head to submit to",
                                      extra={"finished_at": timezone.now()})  # fmt: skip
    wanted = onray.submission_id(job)
    try:
        client = onray.ray_client(job.cluster)
        if job.attempt > 1:
            _stop_previous_attempt(job, client)
        if not _submitted(client, wanted):  # a redelivered task finds its submission and stops there
            try:
                client.submit_job(
                    entrypoint=job.entrypoint,
                    runtime_env=onray.runtime_env(job),
                    submission_id=wanted,
                    metadata={"volt_job": str(job.pk), "attempt": str(job.attempt)},
                )
            except RuntimeError:
                if not _submitted(client, wanted):  # not a twin task that got there first
                    raise
    except (RuntimeError, OSError, ValueError, ConnectionError) as exc:
        return transitions.transition(
            job,
            S.FAILED,
            f"Ray refused the submission: {str(exc)[:500]}",
            extra={"finished_at": timezone.now()},
        )
    updated = Job.objects.filter(pk=job.pk, status=S.PENDING).update(
        ray_submission_id=wanted, submitted_at=timezone.now(), ray_log_seen=0
    )
    job.refresh_from_db()
    if updated:
        transitions.note(job, f"submitted to Ray as {wanted} (attempt {job.attempt})")
        transitions.announce(job)
    else:  # stopped while this task submitted it: it must not run on behind Volt's back
        Job.objects.filter(pk=job.pk).update(ray_submission_id=wanted)
        job.ray_submission_id = wanted
        problems = stopping.stop_through_ray(
            job, settings.VOLT_JOB_STOP_TIMEOUT_S
        ) + stopping.ensure_processes_gone(job)
        transitions.note(job, f"stopped {wanted} right after its submission (stopped meanwhile)" +
             (f": {'; '.join(problems)}" if problems else ""))  # fmt: skip
    return job


def _submitted(client, submission: str) -> bool:
    try:
        client.get_job_info(submission)
    except RuntimeError:  # Ray answers 404 as RuntimeError("... does not exist")
        return False
    return True


def _stop_previous_attempt(job: Job, client) -> None:
    """A resubmission starts only once the previous attempt's processes are gone (it may still run on the
    nodes that survived)."""
    try:
        client.stop_job(onray.submission_id(job, job.attempt - 1))
    except (RuntimeError, OSError):
        pass
    problems = stopping.ensure_processes_gone(job)
    if problems:
        transitions.note(job, "before resubmitting: " + "; ".join(problems))


# --- recovery (issue 14) -----------------------------------------------------------------------------


def jobs_to_resume(cluster: Cluster) -> list[Job]:
    """The cluster's interrupted jobs, oldest first."""
    return list(Job.objects.filter(cluster=cluster, status=S.INTERRUPTED).order_by("created_at", "pk"))


def resubmit_job(job: Job, *, resume_from: str | None, from_step: int | None = None) -> Job:
    """A new attempt of an interrupted job (same row, logs and checkpoint dir), VOLT_RESUME_FROM set when
    `resume_from` is given; submitted by a worker after commit (the previous attempt is stopped first).
    The job is back at `from_step` (the checkpoint's step; none: from the start): `last_step` says so and
    the new attempt's step events start afresh."""
    attempt = job.attempt + 1
    shown = onray.shown_path(job, resume_from) if resume_from else ""
    message = f"resubmitted as attempt {attempt}" + (f", resuming from {shown}" if shown else "")
    with transaction.atomic():
        job = transitions.transition(job, S.PENDING, message, extra={
            "attempt": attempt, "resume_from": resume_from or "", "ray_submission_id": "", "ray_log_seen": 0,
            "submitted_at": None, "finished_at": None, "stop_requested_at": None, "status_reason": "",
            "last_step": from_step, "attempt_steps": {}, "updated_at": timezone.now()})  # fmt: skip
        marker = f"\n[volt: attempt {attempt}{' from ' + shown if shown else ''}]\n"
        JobLogChunk.objects.create(job=job, offset=job.log_size, attempt=attempt, text=marker)
        Job.objects.filter(pk=job.pk).update(log_size=F("log_size") + len(marker))
        job.refresh_from_db()
        onray.queue_start(job.pk)
    return job
