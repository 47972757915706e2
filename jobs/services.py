"""Jobs on clusters: submit, follow, stop, list; the only entry point other apps (recovery) use.

```
submit_job() ─ Job(PENDING) + working dir prepared on Volt's side ─▶ start_job_task (queue jobs)
start_job():   Ray job submission API over HTTP with the cluster's token (never ray.init), submission id
               volt-<install>-job-<id>-a<attempt> (a redelivered task finds it submitted)
poll (beat):   status → JobStatus, new log text stored (logs outlive the cluster; read from the head host by
               byte offset, at most LOG_READ_MAX a read), VOLT_EVENT lines →
               first_step_at / last_step, busbw samples (source job), checkpoints rescanned
stop_job():    Ray stop → every host checked by the job's process marker, leftovers killed → STOPPED
```
Web processes only touch the database and Volt's own disk (the working dir); workers reach clusters.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.db.models import F, QuerySet
from django.db.models.functions import Length
from django.utils import timezone

from clusters import metrics
from clusters import services as clusters
from clusters.choices import ClusterStatus, MetricSource
from clusters.models import Cluster, ClusterNode
from clusters.provisioning import ray_http, ray_nodes
from clusters.tenancy import (
    as_node_user,
    node_temp_dir,
    node_user_prefix,
    ray_auth_token,
    ray_cluster_id,
    shared_storage_dir,
)
from inventory import local_runtime
from inventory import services as inventory
from inventory.choices import DriverKind
from inventory.drivers.base import DriverError
from jobs import logtext, transitions
from jobs.choices import FROM_RAY, LIVE, TERMINAL, WAITING, JobStatus
from jobs.models import Checkpoint, Job, JobEvent, JobLogChunk
from jobs.payloads import job_payload
from jobs.workdirs import (
    CKPT_MODULE,
    WORKLOADS_DIR,
    JobInputError,
    prepare_working_dir,
    prune_working_dir,
)
from voltweb import namespace, realtime
from voltweb import services as accounts
from voltweb.domain import DomainError
from voltweb.statemachine import IllegalTransition
from voltweb.taskutils import enqueue_on_commit

logger = logging.getLogger(__name__)
S = JobStatus

MIB = 1024 * 1024
MAX_ENV_VARS = 64
MAX_ENTRYPOINT = 2000
LOG_PAGE_MAX = 256 * 1024  # characters one /logs/ answer carries at most
BROADCAST_LOG_MAX = 64 * 1024  # a websocket `job_log` event carries at most this; pages fetch the rest
# A job's Ray log is read from the head host LOG_READ_MAX bytes at a time, from where the last read stopped
# (Ray's own API answers the whole log on every call: a chatty job made every poll fetch, JSON-encode and
# hold it all). One poll reads until it has caught up or LOG_POLL_BUDGET_S is spent; the next goes on.
LOG_READ_MAX = 4 * MIB
LOG_POLL_BUDGET_S = 20.0
LOG_READ_TIMEOUT_S = 15.0  # one read; a poll (soft limit 50 s) may start one just before its budget ends
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


# --- who sees what -----------------------------------------------------------------------------------


def visible_jobs(user: AbstractBaseUser) -> QuerySet[Job]:
    """Jobs on the clusters the caller sees (clusters.services.visible_clusters): another team's is a 404."""
    return Job.objects.filter(cluster__in=clusters.visible_clusters(user))


def _announce(job: Job) -> None:
    realtime.broadcast(f"cluster-{job.cluster_id}", {"kind": "job", "job": job_payload(job)})


def note(job: Job, message: str) -> None:
    """A timeline line of the job that is not a status change."""
    JobEvent.objects.create(job=job, message=message)


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
        _announce(job)
        _enqueue_start(job.pk)
    return job


def _enqueue_start(job_id: int) -> None:
    enqueue_on_commit("jobs.tasks.start_job_task", job_id)


# --- what the job gets on the cluster ----------------------------------------------------------------


def submission_id(job: Job, attempt: int | None = None) -> str:
    """Ray's submission id for one attempt: unique per install, so a redelivered submit finds its job."""
    return f"volt-{namespace.current_id()}-job-{job.pk}-a{attempt or job.attempt}"


def job_marker(job: Job) -> str:
    """VOLT_JOB_MARKER: every process of the job carries it (ray_nodes.job_processes finds them by it)."""
    return f"{ray_cluster_id(job.cluster)}/job-{job.pk}"


def _local(cluster: Cluster) -> bool:
    head = _nodes(cluster)[:1]
    return bool(head) and head[0].host.driver == DriverKind.LOCAL


def _nodes(cluster: Cluster) -> list[ClusterNode]:
    return list(
        cluster.nodes.active()
        .filter(slot__isnull=False)
        .select_related("host__provider")
        .order_by("-is_head", "rank")
    )


def checkpoint_dir(job: Job) -> str:
    """`<storage>/jobs/<id>/checkpoints` on the cluster's shared storage (local hosts: this machine's folder;
    ssh hosts: under the cluster's workdir, ${HOME} expanded by Ray)."""
    cluster = job.cluster
    if _local(cluster):
        return str(shared_storage_dir(cluster) / "jobs" / str(job.pk) / "checkpoints")
    return f"{cluster.storage_path.replace('~', '${HOME}', 1)}/jobs/{job.pk}/checkpoints"


def runtime_env(job: Job) -> dict:
    """The Ray runtime_env of the job's current attempt (JOBS_CONTRACT.md's environment)."""
    env = {
        **job.env,
        "VOLT_JOB_ID": str(job.pk),
        "VOLT_CHECKPOINT_DIR": checkpoint_dir(job),
        "VOLT_CHECKPOINT_EVERY": str(job.checkpoint_every),
        "VOLT_NUM_NODES": str(len(_nodes(job.cluster)) or 1),
        ray_nodes.JOB_MARKER_VAR: job_marker(job),
    }
    if job.resume_from:
        env["VOLT_RESUME_FROM"] = job.resume_from
    if _local(job.cluster):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return {"working_dir": job.working_dir, "excludes": ["__pycache__"], "env_vars": env}


def ray_client(cluster: Cluster):
    """Ray's job submission client for the cluster's head, with its token on every request."""
    from ray.job_submission import JobSubmissionClient  # heavy import: only in workers, when used

    return JobSubmissionClient(cluster.dashboard_url, headers=ray_http.auth_headers(ray_auth_token(cluster)))


def start_job(job_id: int) -> Job:
    """Submit a PENDING job's current attempt to Ray (the task body). Idempotent."""
    job = Job.objects.select_related("cluster").get(pk=job_id)
    if job.status != S.PENDING or job.ray_submission_id or job.stop_requested_at:
        return job
    if not job.cluster.dashboard_url:
        return transitions.transition(job, S.FAILED, "its cluster has no Ray head to submit to",
                                      extra={"finished_at": timezone.now()})  # fmt: skip
    wanted = submission_id(job)
    try:
        client = ray_client(job.cluster)
        if job.attempt > 1:
            _stop_previous_attempt(job, client)
        if not _submitted(client, wanted):  # a redelivered task finds its submission and stops there
            try:
                client.submit_job(
                    entrypoint=job.entrypoint,
                    runtime_env=runtime_env(job),
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
        note(job, f"submitted to Ray as {wanted} (attempt {job.attempt})")
        _announce(job)
    else:  # stopped while this task submitted it: it must not run on behind Volt's back
        Job.objects.filter(pk=job.pk).update(ray_submission_id=wanted)
        job.ray_submission_id = wanted
        problems = _stop_through_ray(job, settings.VOLT_JOB_STOP_TIMEOUT_S) + ensure_processes_gone(job)
        note(job, f"stopped {wanted} right after its submission (stopped meanwhile)" +
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
        client.stop_job(submission_id(job, job.attempt - 1))
    except (RuntimeError, OSError):
        pass
    problems = ensure_processes_gone(job)
    if problems:
        note(job, "before resubmitting: " + "; ".join(problems))


# --- follow ------------------------------------------------------------------------------------------


def polled_job_ids() -> list[int]:
    """Jobs the poller follows: submitted and not ended (interrupted ones too: logs, checkpoints)."""
    return list(
        Job.objects.filter(status__in=LIVE | WAITING)
        .exclude(ray_submission_id="")
        .values_list("pk", flat=True)
    )


def requeue_stuck_submissions(older_than_s: float = 60.0) -> int:
    """PENDING jobs never submitted (their worker died, or the task was lost): queue the submission again."""
    cutoff = timezone.now() - timezone.timedelta(seconds=older_than_s)
    stuck = Job.objects.filter(
        status=S.PENDING, ray_submission_id="", stop_requested_at__isnull=True, updated_at__lt=cutoff
    )
    ids = list(stuck.values_list("pk", flat=True))
    for job_id in ids:
        Job.objects.filter(pk=job_id).update(updated_at=timezone.now())
        _enqueue_start(job_id)
    return len(ids)


def poll_job(job_id: int) -> str:
    """One look at a submitted job: Ray status, new log text, its events, checkpoints. Skipped while another
    poll of the same job runs (a Redis lock)."""
    lock = f"job-poll-{namespace.current_id()}-{job_id}"
    if not cache.add(lock, 1, timeout=max(60, int(3 * settings.VOLT_JOB_POLL_S))):
        return "busy"
    try:
        job = Job.objects.select_related("cluster").get(pk=job_id)
        if job.status not in LIVE | WAITING or not job.ray_submission_id:
            return job.status
        return _poll(job).status
    finally:
        cache.delete(lock)


def _poll(job: Job) -> Job:
    try:
        client = ray_client(job.cluster)
        info = client.get_job_info(job.ray_submission_id)
        ray_status = str(getattr(info.status, "value", info.status))
        terminal = FROM_RAY.get(ray_status) in TERMINAL
        started = ray_status != "PENDING"
        rescan, last_text, caught_up = follow_log(job, client, final=terminal, started=started)
    except (RuntimeError, OSError, ValueError, ConnectionError) as exc:
        logger.info("job %s: head did not answer: %s", job.pk, exc)
        if "does not exist" in str(exc) and job.status in LIVE and job.cluster.status == ClusterStatus.READY:
            return transitions.transition(
                job, S.FAILED, "Ray no longer knows the job (its head restarted?)",
                extra={"finished_at": timezone.now()},
            )  # fmt: skip
        return job
    if rescan or (terminal and caught_up):
        rescan_checkpoints(job)
    if terminal and not caught_up:
        return job  # the end of its log is still to be read: the status follows when it is (next polls)
    return _follow_status(job, ray_status, info.message or "", last_text)


def _follow_status(job: Job, ray_status: str, message: str, logs: str) -> Job:
    job.refresh_from_db()
    target = FROM_RAY.get(ray_status)
    if job.status in WAITING or target is None or target == job.status:
        return job
    now = timezone.now()
    if target == S.RUNNING:
        return transitions.transition(job, S.RUNNING, "Ray started the entrypoint", extra={"started_at": now})
    if target == S.PENDING:
        return job
    extra = {"finished_at": now, **({} if job.started_at else {"started_at": now})}
    if target == S.SUCCEEDED:
        reason = "the entrypoint exited 0"
    elif target == S.STOPPED:
        # A stop Volt asked for carries its reason (the user's, or the cluster's termination).
        reason = (
            (job.status_reason or "stopped on request")
            if job.stop_requested_at
            else f"stopped by Ray: {message}"
        )
    else:
        if not logs.strip():  # its log had all been read by earlier polls: the last stored lines
            stored = job.log_chunks.filter(attempt=job.attempt).order_by("-offset").first()
            logs = stored.text if stored else ""
        tail = "\n".join(logs.strip().splitlines()[-5:])
        reason = f"{message or 'the entrypoint failed'}" + (f"\n{tail}" if tail else "")
    extra["status_reason"] = reason[:2000]
    return transitions.transition(job, target, reason[:2000], extra=extra)


def follow_log(job: Job, client, *, final: bool, started: bool = True) -> tuple[bool, str, bool]:
    """Read the job's Ray log on from byte `job.ray_log_seen`, LOG_READ_MAX bytes at a time, storing each
    piece (store_log) and answering its events (apply_events), until caught up or LOG_POLL_BUDGET_S is
    spent. `final`: Ray says the job ended, so a last line without its newline is stored too.
    (checkpoints to rescan, the text of the last piece, caught up).

    The log is read on the head host (read_head_log); where its driver fails, from Ray's API instead (the
    whole log, sliced). `started`: Ray has started the entrypoint, so the log file must exist: a missing
    one is asked of Ray too rather than taken as empty."""
    rescan = False
    last = b""
    deadline = time.monotonic() + LOG_POLL_BUDGET_S
    whole = None  # the log as Ray's API gives it, once asked
    while True:
        piece = None
        if whole is None:
            try:
                piece = read_head_log(job, job.ray_log_seen, LOG_READ_MAX)
            except DriverError as exc:
                logger.info("job %s: log not readable on its head host (%s); asking Ray", job.pk, exc)
            if piece is None and (started or final):
                whole = client.get_job_logs(job.ray_submission_id).encode()
        if whole is not None:
            piece = (whole[job.ray_log_seen : job.ray_log_seen + LOG_READ_MAX], len(whole))
        data, size = piece or (b"", 0)
        at_end = job.ray_log_seen + len(data) >= size
        before = job.ray_log_seen
        rescan = apply_events(job, store_log(job, data, final=final and at_end)) or rescan
        used = job.ray_log_seen - before
        last = data[:used] or last
        if at_end or not used or time.monotonic() > deadline:
            caught_up = at_end and (not final or job.ray_log_seen >= size)
            return rescan, last.decode("utf-8", errors="replace"), caught_up


def read_head_log(job: Job, offset: int, limit: int) -> tuple[bytes, int] | None:
    """Bytes `offset`..`offset + limit` of the job's Ray driver log and the log's whole size, read on the
    cluster's head host through its driver (where Ray writes it: `<temp dir>/session_latest/logs/
    job-driver-<submission id>.log`); None while there is no such file. Raises DriverError."""
    nodes = _nodes(job.cluster)
    if not nodes or not nodes[0].is_head:
        raise DriverError("the cluster has no active head node")
    head = nodes[0]
    path = f"{node_temp_dir(job.cluster, head)}/session_latest/logs/job-driver-{job.ray_submission_id}.log"
    # base64: the bytes exactly as written (the drivers decode output as text); a marker line: whatever the
    # host's shell rc files print comes first. The job owns the folder: it is read as the cluster's user
    # (tenancy.as_node_user), and a link in the log's place is not followed at all.
    command = (
        f'f={shlex.quote(path)}; if [ -L "$f" ] || {{ [ -e "$f" ] && [ ! -f "$f" ]; }}; then '
        'echo "VOLT-LOG refused"; elif [ -f "$f" ]; then '
        'if [ -r "$f" ]; then echo "VOLT-LOG $(stat -c %s "$f")" && '
        f'tail -c +{int(offset) + 1} "$f" | head -c {int(limit)} | base64 -w0; echo; '
        'else echo "VOLT-LOG refused"; fi; else echo "VOLT-LOG missing"; fi'
    )
    with inventory.driver_for(head.host) as driver:
        result = driver.run(as_node_user(job.cluster, head.host, command), timeout=LOG_READ_TIMEOUT_S)
    lines = result.stdout.splitlines()
    marks = [n for n, line in enumerate(lines) if line.startswith("VOLT-LOG ")]
    if not result.ok or not marks:
        raise DriverError(f"reading the job log on {head.host.name} failed: {result.stderr.strip()[:300]}")
    mark = marks[-1]
    size = lines[mark].split(" ", 1)[1].strip()
    if size == "missing":
        return None
    if size == "refused":  # Ray's API (its dashboard runs as the cluster's user) is asked instead
        raise DriverError(
            f"the job's log on {head.host.name} is not a regular file the cluster's user can read"
        )
    encoded = lines[mark + 1].strip() if mark + 1 < len(lines) else ""
    try:
        return base64.b64decode(encoded, validate=True), int(size)
    except ValueError as exc:
        raise DriverError(f"the job log read on {head.host.name} came back garbled: {exc}") from exc


def store_log(job: Job, data: bytes, *, final: bool) -> list[dict]:
    """Keep `data` (the Ray log from byte `job.ray_log_seen` on) — only whole lines while the job runs —
    and broadcast it; answer the VOLT_EVENTs in it. `job.ray_log_seen` moves past what was taken."""
    if not final:
        cut = data.rfind(b"\n") + 1
        if not cut and len(data) >= LOG_READ_MAX:
            cut = len(data)  # one line longer than a read: take it as it is rather than wait forever
        data = data[:cut]  # half a line: wait for the rest
    if not data:
        return []
    new = data.decode("utf-8", errors="replace")
    room = max(0, settings.VOLT_JOB_LOG_MAX_MB * MIB - job.log_size)
    kept = new[:room]
    if len(kept) < len(new) and room:
        kept += f"\n[volt: log cut at VOLT_JOB_LOG_MAX_MB={settings.VOLT_JOB_LOG_MAX_MB}]\n"
    with transaction.atomic():
        offset = job.log_size
        if kept:
            JobLogChunk.objects.create(job=job, offset=offset, attempt=job.attempt, text=kept)
        Job.objects.filter(pk=job.pk).update(
            log_size=F("log_size") + len(kept), ray_log_seen=F("ray_log_seen") + len(data)
        )
        job.log_size += len(kept)
        job.ray_log_seen += len(data)
        if kept:
            realtime.broadcast(
                f"cluster-{job.cluster_id}",
                {"kind": "job_log", "job": job.pk, "offset": offset, "text": kept[:BROADCAST_LOG_MAX],
                 "next_offset": offset + len(kept), "truncated": len(kept) > BROADCAST_LOG_MAX},
            )  # fmt: skip
    return parse_events(new)


def parse_events(text: str) -> list[dict]:
    """The VOLT_EVENT lines of `text` (volt_ckpt.parse_event), malformed ones skipped."""
    from jobs.workloads import volt_ckpt

    events = []
    for line in text.splitlines():
        if "VOLT_EVENT" not in line:
            continue
        try:
            event = volt_ckpt.parse_event(line[line.index("VOLT_EVENT") :])
        except (ValueError, TypeError, KeyError):
            event = None
        if isinstance(event, dict):
            events.append(event)
    return events


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def apply_events(job: Job, events: list[dict]) -> bool:
    """Steps → first_step_at / last_step; busbw → bandwidth samples of source "job"; done → result.
    Returns whether a checkpoint was announced (the caller rescans)."""
    updates: dict[str, Any] = {}
    rescan = False
    last_step = job.last_step
    marks = dict(job.attempt_steps or {})
    stepped_again = None  # a resubmitted attempt's first step: when
    for event in events:
        kind, step = event.get("kind"), _number(event.get("step"))
        if step is not None and kind in ("step", "done", "checkpoint", "busbw"):
            last_step = max(int(step), last_step if last_step is not None else int(step))
            updates["last_step"] = last_step
        if kind == "step" and step is not None:
            when = _number(event.get("time"))
            at = datetime.fromtimestamp(when, UTC) if when else timezone.now()
            mark = [int(step), at.timestamp()]
            if "first" not in marks:
                marks["first"] = mark
                stepped_again = at if job.attempt > 1 else None
            if "last" not in marks or mark[0] > marks["last"][0]:
                if "last" in marks:
                    marks["previous"] = marks["last"][0]
                marks["last"] = mark
            updates["attempt_steps"] = marks
        if kind == "step" and job.first_step_at is None and "first_step_at" not in updates:
            when = _number(event.get("time"))
            updates["first_step_at"] = datetime.fromtimestamp(when, UTC) if when else timezone.now()
        elif kind == "busbw":
            busbw = _number(event.get("busbw_gbps"))
            if busbw is not None and busbw >= 0:
                metrics.record_busbw(job.cluster, busbw, source=MetricSource.JOB)
        elif kind == "checkpoint":
            rescan = True
        elif kind == "done":
            updates["result"] = {k: v for k, v in event.items() if isinstance(v, str | int | float)}
            rescan = True
        elif kind == "resumed":
            note(job, f"resumed from step {event.get('step')} ({str(event.get('path'))[:300]})")
    if updates:
        # Only onto the attempt these events came from: a poll that read attempt N's log while recovery
        # resubmitted the job as N + 1 must not put N's steps back over the new attempt's.
        if not Job.objects.filter(pk=job.pk, attempt=job.attempt).update(**updates):
            return rescan
        for name, value in updates.items():
            setattr(job, name, value)
        _announce(job)
    if stepped_again is not None:
        clusters.record_training_resumed(job.cluster_id, job.pk, job.attempt, stepped_again)
    return rescan


def steps_reached(job: Job, detected_at: datetime) -> dict:
    """Where the current attempt got to, from its events: `last_step` (the largest step of its step,
    checkpoint, busbw and done events), `is_lower_bound` (it may have stepped past it: true unless it logged
    that step and the one before, i.e. it logs every step) and `step_s` (its mean step time, from its own
    step events' clock; failing two of them, its time since the first step over its steps, to detection)."""
    marks = job.attempt_steps or {}
    last = job.last_step
    first_mark, last_mark = marks.get("first"), marks.get("last")
    exact = (
        last is not None
        and last_mark is not None
        and last_mark[0] == last
        and marks.get("previous") == last - 1
    )
    step_s = 0.0
    if first_mark and last_mark and last_mark[0] > first_mark[0]:
        step_s = max(0.0, (last_mark[1] - first_mark[1]) / (last_mark[0] - first_mark[0]))
    elif job.first_step_at and last:
        step_s = max(0.0, (detected_at - job.first_step_at).total_seconds() / max(1, last))
    return {"last_step": last, "is_lower_bound": not exact, "step_s": round(step_s, 4)}


def read_log(job: Job, offset: int = 0, limit: int = LOG_PAGE_MAX, *, readable: bool = False) -> dict:
    """Stored log text from `offset` (characters), at most `limit`; `next_offset` is where to ask next.

    `readable`: the text for people (jobs/logtext.py), rendered from whole lines only: the answer starts at
    the first line that begins at or after `offset` and ends after its last whole line (or at the log's
    end once the job has ended), and `offset` / `next_offset` say where that is in the stored text. A line
    longer than `limit` comes as it is, in pieces. Offsets always count the stored (raw) text."""
    offset, limit = max(0, int(offset)), max(1, min(int(limit), LOG_PAGE_MAX))
    text = _stored_text(job, offset, limit)
    complete = job.status in TERMINAL
    if readable:
        offset, text = _whole_lines(job, offset, limit, text, at_end=complete)
        shown = logtext.readable(text)
    else:
        shown = text
    return {
        "offset": offset,
        "next_offset": offset + len(text),
        "size": job.log_size,
        "text": shown,
        "complete": complete and offset + len(text) >= job.log_size,
        "status": job.status,
    }


def _stored_text(job: Job, offset: int, limit: int) -> str:
    chunks = (
        job.log_chunks.annotate(end=F("offset") + Length("text"))
        .filter(end__gt=offset, offset__lt=offset + limit)
        .order_by("offset")
    )
    return "".join(c.text[max(0, offset - c.offset) :] for c in chunks)[:limit]


def _whole_lines(job: Job, offset: int, limit: int, text: str, *, at_end: bool) -> tuple[int, str]:
    """`text` (stored from `offset`) cut to whole lines: the partial line it starts in is left out, unless
    that line began more than `limit` characters earlier (a reader going on through a line longer than a
    page) or nothing would be left; so is a partial last line, unless it ends the log of an ended job or
    is a piece of a line longer than a page."""
    cut = text.find("\n") + 1
    if offset > 0 and 0 < cut < len(text) and _stored_text(job, offset - 1, 1) != "\n":
        before = _stored_text(job, max(0, offset - limit), min(offset, limit))
        if "\n" in before or offset <= limit:
            offset, text = offset + cut, text[cut:]
    reaches_end = offset + len(text) >= job.log_size
    if text and not text.endswith("\n") and not (at_end and reaches_end):
        last = text.rfind("\n") + 1
        if last or reaches_end:  # the end of a live log inside a line: that line when it is whole
            text = text[:last]
    return offset, text


def log_text_chunks(job: Job):
    """The job's whole stored log, chunk by chunk in order (a download streams it; never all in memory)."""
    return job.log_chunks.order_by("offset").values_list("text", flat=True).iterator(chunk_size=16)


# --- checkpoints -------------------------------------------------------------------------------------


def scan_storage(job: Job) -> list[dict]:
    """volt_ckpt.scan of the job's checkpoint dir, on the cluster's head host through its driver, as the
    user its Ray runs as: the folder is the job's to write, and Volt does not walk it with more rights than
    the job has (tenancy.as_node_user). Local hosts run the module from this machine's source; SSH hosts get
    a copy in the cluster's workdir."""
    nodes = _nodes(job.cluster)
    if not nodes:
        return []
    head = nodes[0]
    folder = checkpoint_dir(job).replace("${HOME}", "$HOME")
    with inventory.driver_for(head.host) as driver:
        if head.host.driver == DriverKind.LOCAL:
            module, python = str(WORKLOADS_DIR / CKPT_MODULE), local_runtime.python_for_local_hosts()
        else:
            workdir = ray_nodes.workdir_for(ray_cluster_id(job.cluster))
            driver.copy_file(WORKLOADS_DIR / CKPT_MODULE, f"{workdir}/{CKPT_MODULE}")
            module, python = f"$HOME/{workdir}/{CKPT_MODULE}", settings.VOLT_HOST_PYTHON
        # No folder yet: no checkpoints. A scan that fails (no Python, the module missing, a folder the
        # cluster's user cannot read) is an error, not "no checkpoints": recovery would resume from scratch
        # without a word. The module is read by Volt's shell and handed over as code: the cluster's user
        # need not reach Volt's source, and runs it with nothing of Volt's environment.
        switch = node_user_prefix(job.cluster, head.host)
        clean = "env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 " if switch else ""
        command = (
            f'if [ -d "{folder}" ]; then code="$(cat "{module}")" && '
            f'{switch}{clean}{shlex.quote(python)} -c "$code" scan "{folder}"; else echo "[]"; fi'
        )
        result = driver.run(command, timeout=60)
    if not result.ok:
        raise DriverError(f"checkpoint scan failed on {nodes[0].host.name}: {result.stderr.strip()[:300]}")
    # The scan prints indented JSON (a list: its first line is "[" at the margin), perhaps after whatever
    # the user's shell rc files print.
    lines = result.stdout.splitlines()
    starts = [number for number, line in enumerate(lines) if line.startswith("[")]
    if not starts:
        raise ValueError(f"checkpoint scan on {nodes[0].host.name} printed no list: {result.stdout[-300:]!r}")
    return json.loads("\n".join(lines[starts[-1] :]))


def rescan_checkpoints(job: Job) -> list[Checkpoint]:
    """Record what is on storage now: one Checkpoint row per `step-*` folder, synchronized or why not."""
    try:
        found = scan_storage(job)
    except (DriverError, OSError, ValueError) as exc:
        logger.warning("job %s: checkpoint scan failed: %s", job.pk, exc)
        return list(job.checkpoints.all())
    seen = set()
    for entry in found:
        seen.add(entry["path"])
        created = _number(entry.get("created"))
        Checkpoint.objects.update_or_create(
            job=job,
            path=entry["path"],
            defaults={
                "step": int(entry.get("step") or 0),
                "size_bytes": int(entry.get("bytes") or 0),
                "created": datetime.fromtimestamp(created, UTC) if created else None,
                "synchronized": bool(entry.get("synchronized")),
                "reason": str(entry.get("reason") or "")[:1000],
                "world_size": entry.get("world_size") if isinstance(entry.get("world_size"), int) else None,
            },
        )
    job.checkpoints.exclude(path__in=seen).update(synchronized=False, reason="no longer on shared storage")
    rows = list(job.checkpoints.all())
    realtime.broadcast(
        f"cluster-{job.cluster_id}",
        {"kind": "job_checkpoints", "job": job.pk, "checkpoints": [checkpoint_payload(c) for c in rows]},
    )
    return rows


def checkpoint_payload(c: Checkpoint) -> dict:
    return {"step": c.step, "path": c.path, "size_bytes": c.size_bytes, "synchronized": c.synchronized,
            "reason": c.reason, "created": c.created.isoformat() if c.created else None}  # fmt: skip


def latest_synchronized_checkpoint(job: Job) -> Checkpoint | None:
    """The newest checkpoint every rank finished (rescanned first): the only kind ever resumed from."""
    rescan_checkpoints(job)
    return job.checkpoints.filter(synchronized=True).order_by("-step").first()


# --- stop --------------------------------------------------------------------------------------------


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
    note(job, f"stop requested: {reason}")
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
        problems += _stop_through_ray(job, settings.VOLT_JOB_STOP_TIMEOUT_S)
    problems += ensure_processes_gone(job)
    if job.ray_submission_id:
        try:
            _poll(job)  # the last lines (and the status Ray ended with)
        except Exception:  # noqa: BLE001 - logs are best effort next to the stop
            logger.warning("job %s: last poll after stop failed", job.pk, exc_info=True)
    job.refresh_from_db()
    if job.status in LIVE | WAITING:
        detail = f"; {'; '.join(problems)}" if problems else ""
        job = transitions.transition(job, S.STOPPED, reason + detail, extra={
            "finished_at": timezone.now(), "status_reason": (reason + detail)[:2000]})  # fmt: skip
    elif problems:
        note(job, "; ".join(problems))
    return job


def _stop_through_ray(job: Job, timeout_s: float) -> list[str]:
    try:
        client = ray_client(job.cluster)
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
    for node in _nodes(job.cluster):
        with inventory.driver_for(node.host) as driver:
            found[node.host.name] = ray_nodes.job_processes(
                driver, ray_cluster_id(job.cluster), job_marker(job), kill=kill
            )
    return found


def ensure_processes_gone(job: Job, timeout_s: float | None = None) -> list[str]:
    """Wait (bounded) until no process of the job runs on any host; kill what is left. Problems, or []."""
    deadline = time.monotonic() + (timeout_s or settings.VOLT_JOB_STOP_TIMEOUT_S)
    problems: list[str] = []
    for node in _nodes(job.cluster):
        try:
            with inventory.driver_for(node.host) as driver:
                args = (driver, ray_cluster_id(job.cluster), job_marker(job))
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
        problems = _stop_through_ray(job, 10.0) if job.ray_submission_id else []
        if job.ray_submission_id:
            try:
                _poll(job)
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
    message = f"resubmitted as attempt {attempt}" + (f", resuming from {resume_from}" if resume_from else "")
    with transaction.atomic():
        job = transitions.transition(job, S.PENDING, message, extra={
            "attempt": attempt, "resume_from": resume_from or "", "ray_submission_id": "", "ray_log_seen": 0,
            "submitted_at": None, "finished_at": None, "stop_requested_at": None, "status_reason": "",
            "last_step": from_step, "attempt_steps": {}, "updated_at": timezone.now()})  # fmt: skip
        marker = f"\n[volt: attempt {attempt}{' from ' + resume_from if resume_from else ''}]\n"
        JobLogChunk.objects.create(job=job, offset=job.log_size, attempt=attempt, text=marker)
        Job.objects.filter(pk=job.pk).update(log_size=F("log_size") + len(marker))
        job.refresh_from_db()
        _enqueue_start(job.pk)
    return job
