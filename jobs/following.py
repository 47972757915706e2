"""Following a job: beat polls its Ray status, stores its log by byte offset from the head host, turns its
VOLT_EVENT lines into steps, bandwidth samples and checkpoints, and serves its log to people."""

from __future__ import annotations

import base64
import logging
import re
import shlex
import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Length
from django.utils import timezone

from clusters import services as clusters
from clusters.choices import ClusterStatus, MetricSource
from clusters.telemetry import metrics
from clusters.tenancy import (
    as_node_user,
    node_driver,
    node_temp_dir,
)
from inventory.drivers.base import DriverError
from jobs import checkpoints, logtext, onray, transitions
from jobs.choices import FROM_RAY, LIVE, TERMINAL, WAITING, JobStatus
from jobs.models import Job, JobLogChunk
from voltweb import namespace, realtime
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
S = JobStatus
MIB = 1024 * 1024
LOG_PAGE_MAX = 256 * 1024  # characters one /logs/ answer carries at most
BROADCAST_LOG_MAX = 64 * 1024  # a websocket `job_log` event carries at most this; pages fetch the rest
# A job's Ray log is read from the head host LOG_READ_MAX bytes at a time, from where the last read stopped
# (Ray's own API answers the whole log on every call: a chatty job made every poll fetch, JSON-encode and
# hold it all). One poll reads until it has caught up or LOG_POLL_BUDGET_S is spent; the next goes on.
LOG_READ_MAX = 4 * MIB
LOG_POLL_BUDGET_S = 20.0
LOG_READ_TIMEOUT_S = 15.0  # one read; a poll (soft limit 50 s) may start one just before its budget ends


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
        onray.queue_start(job_id)
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
        return poll_now(job).status
    finally:
        cache.delete(lock)


def poll_now(job: Job) -> Job:
    """What Ray says of `job`'s current submission, applied only while that is still the job's submission:
    recovery may resubmit the job (a new attempt, a new submission) while this poll waits on Ray, and what
    Ray says of the old one must not be written over the new (every write below is guarded by it)."""
    submission = job.ray_submission_id
    try:
        client = onray.ray_client(job.cluster)
        info = client.get_job_info(job.ray_submission_id)
        ray_status = str(getattr(info.status, "value", info.status))
        terminal = FROM_RAY.get(ray_status) in TERMINAL
        started = ray_status != "PENDING"
        rescan, last_text, caught_up = follow_log(job, client, final=terminal, started=started)
    except (RuntimeError, OSError, ValueError, ConnectionError) as exc:
        logger.info("job %s: head did not answer: %s", job.pk, exc)
        if "does not exist" in str(exc) and job.status in LIVE and job.cluster.status == ClusterStatus.READY:
            return _stale_safe(job, S.FAILED, "Ray no longer knows the job (its head restarted?)",
                               {"finished_at": timezone.now()}, submission)  # fmt: skip
        return job
    if rescan or (terminal and caught_up):
        checkpoints.rescan_checkpoints(job)
    if terminal and not caught_up:
        return job  # the end of its log is still to be read: the status follows when it is (next polls)
    return _follow_status(job, ray_status, info.message or "", last_text)


def _stale_safe(job: Job, to: str, reason: str, extra: dict, submission: str) -> Job:
    """transition() guarded by the submission the poll read; a job resubmitted meanwhile is left as it is."""
    try:
        return transitions.transition(job, to, reason, extra=extra, where={"ray_submission_id": submission})
    except IllegalTransition:
        job.refresh_from_db()
        if job.ray_submission_id == submission:
            raise
        logger.info(
            "job %s: resubmitted while polled; what Ray said of %s is not applied", job.pk, submission
        )
        return job


def _follow_status(job: Job, ray_status: str, message: str, logs: str) -> Job:
    submission = job.ray_submission_id
    job.refresh_from_db()
    target = FROM_RAY.get(ray_status)
    if job.ray_submission_id != submission:  # resubmitted while this poll asked Ray about the last attempt
        return job
    if job.status in WAITING or target is None or target == job.status:
        return job
    now = timezone.now()
    if target == S.RUNNING:
        return _stale_safe(job, S.RUNNING, "Ray started the entrypoint", {"started_at": now}, submission)
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
        tail = "\n".join(_shortened(line, REASON_LINE_MAX) for line in reason_lines(logs))
        reason = failure_headline(message) + (f"\n{tail}" if tail else "")
    extra["status_reason"] = reason[:2000]
    return _stale_safe(job, target, reason[:2000], extra, submission)


# A failed job's reason is read in a red box and a timeline line: Ray's first line and the log's last
# lines, each this long at most (Ray's message carries the whole log, or a state dump, after its first line).
REASON_LINE_MAX = 300


# A traceback's marker line under the failing expression ("    ^^^^^^", "~~~~^^^"), after its Ray prefix.
_MARKERS = re.compile(r"^(\([^)]*\)\s*)?[\s^~]*$")


def reason_lines(logs: str, count: int = 5) -> list[str]:
    """The log's last `count` lines as people read them (jobs/logtext: no colour codes, events as
    sentences), without blank lines and a traceback's ^^^ marker lines."""
    lines = [line.strip() for line in logtext.readable(logs).splitlines()]
    return [line for line in lines if line and not _MARKERS.match(line)][-count:]


def failure_headline(message: str) -> str:
    """Ray's failure message as one line: "Job entrypoint command failed with exit code 1" without the
    ", last available logs (truncated to 20,000 chars):" and the logs that follow it (the reason shows the
    log's own last lines)."""
    lines = (message or "").strip().splitlines()
    first = lines[0].split(", last available logs", 1)[0].rstrip(" :") if lines else ""
    return _shortened(first, REASON_LINE_MAX) or "the entrypoint failed"


def _shortened(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


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
    nodes = onray.live_nodes(job.cluster)
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
    with node_driver(head.host) as driver:
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
        # Only onto the submission this text came from (a job resubmitted meanwhile starts its log afresh).
        row = Job.objects.select_for_update().filter(pk=job.pk, ray_submission_id=job.ray_submission_id)
        stored = row.values("log_size", "ray_log_seen").first()
        if stored is None:
            return []
        offset = stored["log_size"]
        if kept:
            JobLogChunk.objects.create(job=job, offset=offset, attempt=job.attempt, text=kept)
        row.update(log_size=F("log_size") + len(kept), ray_log_seen=F("ray_log_seen") + len(data))
        job.log_size = offset + len(kept)
        job.ray_log_seen = stored["ray_log_seen"] + len(data)
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


def apply_events(job: Job, events: list[dict]) -> bool:
    """Steps → first_step_at / last_step; busbw → bandwidth samples of source "job"; done → result.
    Returns whether a checkpoint was announced (the caller rescans)."""
    updates: dict[str, Any] = {}
    rescan = False
    last_step = job.last_step
    marks = dict(job.attempt_steps or {})
    stepped_again = None  # a resubmitted attempt's first step: when
    for event in events:
        kind, step = event.get("kind"), checkpoints.number(event.get("step"))
        if step is not None and kind in ("step", "done", "checkpoint", "busbw"):
            last_step = max(int(step), last_step if last_step is not None else int(step))
            updates["last_step"] = last_step
        if kind == "step" and step is not None:
            when = checkpoints.number(event.get("time"))
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
            when = checkpoints.number(event.get("time"))
            updates["first_step_at"] = datetime.fromtimestamp(when, UTC) if when else timezone.now()
        elif kind == "busbw":
            busbw = checkpoints.number(event.get("busbw_gbps"))
            if busbw is not None and busbw >= 0:
                metrics.record_busbw(job.cluster, busbw, source=MetricSource.JOB)
        elif kind == "checkpoint":
            rescan = True
        elif kind == "done":
            updates["result"] = {k: v for k, v in event.items() if isinstance(v, str | int | float)}
            rescan = True
        elif kind == "resumed":
            shown = onray.shown_path(job, str(event.get("path")))[:300]
            transitions.note(job, f"resumed from step {event.get('step')} ({shown})")
    if updates:
        # Only onto the attempt these events came from: a poll that read attempt N's log while recovery
        # resubmitted the job as N + 1 must not put N's steps back over the new attempt's.
        if not Job.objects.filter(pk=job.pk, attempt=job.attempt).update(**updates):
            return rescan
        for name, value in updates.items():
            setattr(job, name, value)
        transitions.announce(job)
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
