"""Automatic recovery: a DEGRADED cluster gets its failed nodes replaced and goes back to READY.

    watch: READY → DEGRADED (a node failed) ─▶ on_degraded(): a Recovery record (detected at, cause,
           failed hosts) → recover_cluster_task on commit (queue: provisioning)
    worker ─▶ recover_cluster(id) (idempotent; a Redis lock keeps one task per cluster):
        DEGRADED → RECOVERING
        stopping:     hooks' stop() (the jobs app stops what is left of the cluster's jobs); this
                      cluster's processes on the failed hosts stopped (whatever is left of them)
        placing:      provision.replace_hosts(): the failed hosts cordoned as suspect, their nodes placed
                      as close as possible to the survivors (block, fabric, site, anywhere; the reason
                      recorded); the head lost → every node stopped, the cluster re-formed around a new head
                      no free host → waits in RECOVERING (phase waiting_for_capacity, the reason on the
                      record and as the cluster's queue_reason); retried by beat (retry_recoveries) until
                      capacity appears; policy `shrink` instead re-forms the cluster on the survivors
        provisioning: provision.bring_up() (idempotent: running nodes are found, not restarted);
                      a replacement that fails to come up is replaced in turn, up to
                      VOLT_RECOVERY_ATTEMPTS, then FAILED with everything released (provision.fail)
        verifying:    provision.verify(replace_slow=False): the probe within its budget → READY | FAILED
        resuming:     hooks' resume() (the jobs app resubmits from the last synchronized checkpoint)

Hooks keep the dependency direction (jobs → clusters): the jobs app registers an object with
`stop(cluster, recovery)` and `resume(cluster, recovery) -> list[dict]` at start-up (register_hook);
this module never imports it. A resume() result is one dict per job resumed: {"job", "name", "attempt",
"checkpoint_step", "checkpoint_path", "last_step", "steps_lost", "steps_lost_is_lower_bound", "step_s",
"resubmitted_at"}; they are stored on the record (`jobs`) with the accounting below.

Accounting. Two moments after READY: the jobs are resubmitted (`job_resubmitted_at`), and later a
resubmitted job logs a training step again (`training_resumed_at`, the workload's own clock, recorded by
the jobs app through training_resumed()). Lost work per job = the cluster's GPUs x (detection → its
training stepped again, until then → its resubmission) + its lost steps x its mean step time. The
record's `gpu_hours_lost` counts the downtime once: GPUs x (detection → the first job stepping again, or
the resubmission, or the recovery's end when no job was resumed) + every job's lost steps' time.

Every phase change is saved on the record (`phases`: start and end of each), noted on the cluster's
timeline and broadcast on the cluster's group as a `recovery` event, so the page shows it live.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from clusters import allocations, provision, transitions
from clusters.choices import RECOVERY_OPEN, ClusterStatus, FailureReason, RecoveryPolicy, Verdict
from clusters.choices import RecoveryStatus as R
from clusters.models import Cluster, ClusterNode, NodeHealth, Recovery, RecoveryJob
from clusters.telemetry import ray_head
from voltweb import locks, realtime
from voltweb.statemachine import IllegalTransition
from voltweb.taskutils import enqueue_on_commit

logger = logging.getLogger(__name__)
S = ClusterStatus
LOCKED = "locked"
# Rules under which a worker failed only because its head did (its host is fine): re-formed, not replaced.
_FOLLOWS_HEAD = ("Ray node process not running", "the head lists this node as")

_hooks: list = []


def register_hook(hook) -> None:
    """Add an object with stop(cluster, recovery) and resume(cluster, recovery) -> list[dict] (jobs app)."""
    if hook not in _hooks:
        _hooks.append(hook)


# --- starting ----------------------------------------------------------------------------------------


def open_recovery(cluster: Cluster) -> Recovery | None:
    return cluster.recoveries.filter(status__in=RECOVERY_OPEN).order_by("-detected_at").first()


def on_degraded(cluster: Cluster, failed: list[tuple[ClusterNode, str]], cause: str) -> Recovery:
    """The watch moved `cluster` to DEGRADED: record the failure and queue the recovery (VOLT_AUTO_RECOVER)."""
    recovery = open_recovery(cluster) or start(cluster, failed, cause)
    if settings.VOLT_AUTO_RECOVER:
        queue(cluster.pk)
    return recovery


def start(cluster: Cluster, failed: list[tuple[ClusterNode, str]], cause: str) -> Recovery:
    """A Recovery record for the failed nodes. When the head is among them, the workers that only lost
    their head (process gone, listed DEAD) are re-formed with it, not replaced: their hosts are fine."""
    head_lost = any(node.is_head for node, _ in failed)
    if head_lost:
        failed = [(n, rule) for n, rule in failed if n.is_head or not rule.startswith(_FOLLOWS_HEAD)]
    recovery = Recovery.objects.create(
        cluster=cluster,
        cause=cause[:2000],
        head_lost=head_lost,
        failed_hosts=[
            {"id": n.host_id, "name": n.host.name, "rank": n.rank, "is_head": n.is_head, "rule": rule}
            for n, rule in failed
        ],
        phases=[{"phase": "detected", "started": timezone.now().isoformat(), "ended": None}],
    )
    _announce(cluster, recovery)
    return recovery


def start_from_health(cluster: Cluster) -> Recovery:
    """A DEGRADED cluster without a recovery (auto-recovery was off, or the watch's hook never ran): its
    failed nodes are those whose last verdict is failed; none (a fault that cleared) → the head's view
    is trusted and the record says nothing failed: the cluster is verified and goes back to READY."""
    rows = NodeHealth.objects.filter(
        node__cluster=cluster, node__released_at__isnull=True, verdict=Verdict.FAILED
    ).select_related("node__host")
    failed = [(row.node, row.rule) for row in rows]
    last = cluster.events.filter(to_status=S.DEGRADED).order_by("-at").first()
    return start(cluster, failed, last.message if last else "degraded")


def queue(cluster_id: int) -> None:
    enqueue_on_commit("clusters.tasks.recover_cluster_task", cluster_id)


def lock_key(cluster_id: int) -> str:
    return f"volt:recover:{cluster_id}"


# --- the task body -----------------------------------------------------------------------------------


def recover_cluster(cluster_id: int) -> str:
    """Take a DEGRADED (or RECOVERING) cluster back to READY, or to a clean FAILED. Returns its status,
    or "locked" when another task recovers it now. Safe to call again at any point."""
    token = uuid.uuid4().hex
    if not cache.add(lock_key(cluster_id), token, timeout=settings.VOLT_RECOVERY_STALE_S):
        return LOCKED
    try:
        return _recover(Cluster.objects.get(pk=cluster_id)).status
    finally:
        locks.release(lock_key(cluster_id), token)  # only its own: one that expired and was retaken stays


def _recover(cluster: Cluster) -> Cluster:
    recovery = open_recovery(cluster)
    if cluster.status not in (S.DEGRADED, S.RECOVERING):
        if recovery is not None:  # terminated meanwhile
            _end(cluster, recovery, R.ABANDONED, f"cluster is {cluster.status}")
        return cluster
    recovery = recovery or start_from_health(cluster)
    try:
        if cluster.status == S.DEGRADED:
            names = ", ".join(h["name"] for h in recovery.failed_hosts) or "no node"
            cluster = transitions.transition(cluster, S.RECOVERING, f"recovering: replacing {names}")
        return _repair(cluster, recovery)
    except (provision.Abandoned, IllegalTransition):
        cluster = provision.abandon(cluster)
        _end(cluster, recovery, R.ABANDONED, f"cluster became {cluster.status} while recovering")
        return cluster


def _repair(cluster: Cluster, recovery: Recovery) -> Cluster:
    for _ in range(settings.VOLT_RECOVERY_ATTEMPTS + 1):
        failed = _failed_nodes(cluster, recovery)
        if failed:
            if recovery.status != R.WAITING:  # a retry after waiting: stopped already, stays "waiting"
                _phase(cluster, recovery, "stopping")
                _stop_work(cluster, recovery)
                provision.teardown(cluster, failed)
                _phase(cluster, recovery, "placing")
            try:
                replacement = provision.replace_hosts(
                    cluster,
                    [n.host_id for n in failed],
                    "; ".join(h["rule"] for h in recovery.failed_hosts if h.get("rule")) or recovery.cause,
                    context="recovering",
                )
            except provision.NoReplacement as exc:
                if cluster.recovery_policy == RecoveryPolicy.SHRINK and _survivors(cluster, failed):
                    _shrink(cluster, recovery, failed, str(exc))
                else:
                    return _wait(cluster, recovery, str(exc))
            else:
                _replaced(cluster, recovery, replacement)
        elif recovery.status == R.WAITING:
            transitions.move_recovery(recovery, R.ACTIVE, waiting_reason="")
        _phase(cluster, recovery, "provisioning")
        try:
            provision.bring_up(cluster)
        except provision.HostsFailed as failure:
            attempts = recovery.attempts + 1
            _set(recovery, attempts=attempts)
            transitions.note(
                cluster,
                f"recovery: replacement failed ({attempts}/{settings.VOLT_RECOVERY_ATTEMPTS}): {failure}",
                heartbeat=True,
            )
            if attempts >= settings.VOLT_RECOVERY_ATTEMPTS:
                return _fail(cluster, recovery, f"gave up after {attempts} failed replacements: {failure}")
            _add_failed(recovery, cluster, failure.host_ids, str(failure))
            continue
        _set(recovery, replacement_ready_at=timezone.now())
        _phase(cluster, recovery, "verifying")
        # The probe runs on the cluster's hosts, not on Ray's node list: it does not wait for the head
        # to give up on the dead node. The resumed jobs do (below).
        cluster = provision.verify(Cluster.objects.get(pk=cluster.pk), replace_slow=False)
        if cluster.status != S.READY:
            _end(cluster, recovery, R.FAILED, cluster.failure_message or f"cluster is {cluster.status}")
            return cluster
        _set(recovery, ready_at=timezone.now())
        _wait_failed_nodes_dead(cluster)
        Cluster.objects.filter(pk=cluster.pk).update(queue_reason="")
        _phase(cluster, recovery, "resuming")
        _resume_work(cluster, recovery)
        _end(cluster, recovery, R.SUCCEEDED, "recovered")
        return cluster
    return _fail(cluster, recovery, "recovery did not converge")


def _wait_failed_nodes_dead(cluster: Cluster) -> None:
    """Until the head lists only the cluster's nodes ALIVE (at most VOLT_NODE_JOIN_TIMEOUT_S).

    A node whose raylet was killed stays ALIVE in the head's list until Ray's health checks give up on
    it (5 x VOLT_RAY_HEALTH_CHECK_PERIOD_MS); a resumed job would be placed on it meanwhile."""
    expected = {n.node_ip for n in provision.active_nodes(cluster)}
    token = ray_head.token_for(cluster)
    deadline = time.monotonic() + settings.VOLT_NODE_JOIN_TIMEOUT_S
    alive: set[str] = set()
    while time.monotonic() < deadline:
        try:
            listed = ray_head.head_nodes(ray_head.dashboard_for(cluster), 5.0, token)
            alive = {n.get("node_ip") for n in listed if n.get("state") == "ALIVE"}
            if alive <= expected:
                return
        except ray_head.HeadUnreachable:
            pass
        time.sleep(0.5)
    transitions.note(
        cluster, f"recovery: the head still lists {sorted(alive - expected)} as ALIVE", heartbeat=True
    )


def _failed_nodes(cluster: Cluster, recovery: Recovery) -> list[ClusterNode]:
    """The failed hosts' nodes not yet replaced (a resumed task finds the replacement done: none)."""
    host_ids = {h["id"] for h in recovery.failed_hosts}
    return [n for n in provision.active_nodes(cluster) if n.host_id in host_ids]


def _survivors(cluster: Cluster, failed: list[ClusterNode]) -> list[ClusterNode]:
    return [n for n in provision.active_nodes(cluster) if n not in failed]


def _add_failed(recovery: Recovery, cluster: Cluster, host_ids, rule: str) -> None:
    known = {h["id"] for h in recovery.failed_hosts}
    nodes = [n for n in provision.active_nodes(cluster) if n.host_id in set(host_ids) - known]
    added = [
        {"id": n.host_id, "name": n.host.name, "rank": n.rank, "is_head": n.is_head, "rule": rule[:300]}
        for n in nodes
    ]
    _set(recovery, failed_hosts=recovery.failed_hosts + added)


def _replaced(cluster: Cluster, recovery: Recovery, replacement: provision.Replacement) -> None:
    reasons = [r for r in (recovery.replacement_reason, replacement.reason) if r]
    _set(
        recovery,
        replacement_hosts=recovery.replacement_hosts + list(replacement.hosts),
        replacement_reason="; then ".join(reasons),
        replacement_placed_at=timezone.now(),
        waiting_reason="",
    )
    if recovery.status != R.ACTIVE:  # a waiting recovery that found capacity
        transitions.move_recovery(recovery, R.ACTIVE)
    Cluster.objects.filter(pk=cluster.pk).update(queue_reason="")


def _shrink(cluster: Cluster, recovery: Recovery, failed: list[ClusterNode], why: str) -> None:
    """Policy `shrink`: give the failed nodes back and re-form on the survivors (a new head if it was lost)."""
    survivors = _survivors(cluster, failed)
    if any(n.is_head for n in failed):
        provision.teardown(cluster, survivors)
        ClusterNode.objects.filter(pk=survivors[0].pk).update(is_head=True)
    allocations.release_nodes(cluster, [n.pk for n in failed])
    message = f"shrunk to {len(survivors)} node(s) (policy shrink): {why}"
    _set(recovery, replacement_reason=message, replacement_placed_at=timezone.now(), waiting_reason="")
    transitions.note(cluster, f"recovery: {message}", heartbeat=True)


def _wait(cluster: Cluster, recovery: Recovery, why: str) -> Cluster:
    reason = f"waiting for capacity: {why}"
    first = recovery.status != R.WAITING
    if first:
        transitions.move_recovery(recovery, R.WAITING, waiting_reason=reason)
    else:
        _set(recovery, waiting_reason=reason)
    _phase(cluster, recovery, "waiting_for_capacity")
    Cluster.objects.filter(pk=cluster.pk).update(queue_reason=reason, updated_at=timezone.now())
    if first:
        transitions.note(
            cluster, f"recovery {reason}; retried when a host is added or GPUs are released", heartbeat=True
        )
    return Cluster.objects.get(pk=cluster.pk)


def _fail(cluster: Cluster, recovery: Recovery, message: str) -> Cluster:
    cluster = provision.fail(Cluster.objects.get(pk=cluster.pk), FailureReason.HOST_FAILED, message)
    _end(cluster, recovery, R.FAILED, message)
    return cluster


# --- the record --------------------------------------------------------------------------------------


def _set(recovery: Recovery, **fields) -> None:
    for name, value in fields.items():
        setattr(recovery, name, value)
    recovery.save(update_fields=[*fields, "updated_at"])


def _phase(cluster: Cluster, recovery: Recovery, phase: str) -> None:
    """Close the current phase, open `phase` (the same phase again is a no-op), tell the page."""
    if recovery.phase == phase:
        Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
        return
    now = timezone.now().isoformat()
    phases = [dict(p) for p in recovery.phases]
    if phases and phases[-1].get("ended") is None:
        phases[-1]["ended"] = now
    phases.append({"phase": phase, "started": now, "ended": None})
    _set(recovery, phase=phase, phases=phases)
    transitions.note(cluster, f"recovery: {phase.replace('_', ' ')}", heartbeat=True)
    _announce(cluster, recovery)


def _end(cluster: Cluster, recovery: Recovery, status: str, message: str) -> None:
    now = timezone.now()
    phases = [dict(p) for p in recovery.phases]
    if phases and phases[-1].get("ended") is None:
        phases[-1]["ended"] = now.isoformat()
    phase = {R.SUCCEEDED: "done"}.get(status, status)
    phases.append({"phase": phase, "started": now.isoformat(), "ended": now.isoformat()})
    with transaction.atomic():  # training_resumed() may record a job stepping again at the same time
        fresh = Recovery.objects.select_for_update().only("training_resumed_at").get(pk=recovery.pk)
        recovery.training_resumed_at = fresh.training_resumed_at
        recovery.ended_at = now
        try:
            transitions.move_recovery(recovery, status, phase=phase, phases=phases, message=message[:2000],
                                      ended_at=now, waiting_reason="",
                                      gpu_hours_lost=_record_gpu_hours(recovery, _gpus(cluster)))  # fmt: skip
        except IllegalTransition as exc:  # ended already (another path got there first): it stays as it ended
            logger.info(
                "recovery %s of cluster %s: not ended again as %s: %s", recovery.pk, cluster.pk, status, exc
            )
            return
    _announce(cluster, recovery)


def _gpus(cluster: Cluster) -> int:
    spec = cluster.spec or {}
    return int(spec.get("nodes") or 0) * int(spec.get("gpus_per_node") or 0)


def _job_gpu_hours(row: RecoveryJob, detected_at, gpus: int) -> float:
    """One job's lost work: GPUs x (detection → it stepped again, or its resubmission; + its lost steps)."""
    until = row.training_resumed_at or row.resubmitted_at
    idle_s = max(0.0, (until - detected_at).total_seconds()) if until else 0.0
    return round(gpus * (idle_s + row.lost_steps_s) / 3600, 4)


def _record_gpu_hours(recovery: Recovery, gpus: int) -> float | None:
    """The record's total: the cluster's downtime once, plus each job's lost steps (see the docstring)."""
    until = recovery.training_resumed_at or recovery.job_resubmitted_at or recovery.ended_at
    if until is None:
        return None
    idle_s = max(0.0, (until - recovery.detected_at).total_seconds())
    lost_steps_s = sum(row.lost_steps_s for row in RecoveryJob.objects.filter(recovery=recovery))
    return round(gpus * (idle_s + lost_steps_s) / 3600, 4)


def training_resumed(cluster_id: int, job_id: int, attempt: int, at) -> bool:
    """The jobs app saw `attempt` of job `job_id` log its first training step at `at` (the workload's
    clock): recorded on the recovery that resubmitted it, its GPU-hours counted to then. Returns whether a
    recovery took it (a first attempt, or one resubmitted by hand, has none)."""
    with transaction.atomic():
        row = (
            RecoveryJob.objects.filter(
                recovery__cluster_id=cluster_id, recovery__job_resubmitted_at__isnull=False,
                job_id=job_id, attempt=attempt,
            )
            .order_by("-recovery__detected_at", "-recovery_id")
            .first()
        )  # fmt: skip
        if row is None:
            return False
        recovery = Recovery.objects.select_for_update().select_related("cluster").get(pk=row.recovery_id)
        row = RecoveryJob.objects.select_for_update().get(pk=row.pk)
        if row.training_resumed_at is not None:
            return True
        row.training_resumed_at = at
        row.gpu_hours_lost = _job_gpu_hours(row, recovery.detected_at, row.gpus or _gpus(recovery.cluster))
        row.save(update_fields=["training_resumed_at", "gpu_hours_lost"])
        if recovery.training_resumed_at is None or at < recovery.training_resumed_at:
            recovery.training_resumed_at = at
        fields = {"training_resumed_at": recovery.training_resumed_at}
        if recovery.ended_at is not None:
            fields["gpu_hours_lost"] = _record_gpu_hours(recovery, _gpus(recovery.cluster))
        _set(recovery, **fields)
        transaction.on_commit(lambda done=recovery: _announce(done.cluster, done))
        return True


def _stop_work(cluster: Cluster, recovery: Recovery) -> None:
    for hook in list(_hooks):
        try:
            hook.stop(cluster, recovery)
        except Exception:  # a hook must not leave the cluster unrepaired
            logger.exception("recovery hook %r failed to stop work on cluster %s", hook, cluster.pk)


def _resume_work(cluster: Cluster, recovery: Recovery) -> None:
    resumed: list[dict] = []
    for hook in list(_hooks):
        try:
            resumed += list(hook.resume(cluster, recovery) or [])
        except Exception:
            logger.exception("recovery hook %r failed to resume work on cluster %s", hook, cluster.pk)
            transitions.note(
                cluster, "recovery: resuming the cluster's jobs failed (see the jobs' pages)", heartbeat=True
            )
    if resumed:
        gpus = _gpus(cluster)
        rows = []
        for entry in resumed:
            row = RecoveryJob(
                recovery=recovery, job_id=entry["job"], name=entry.get("name") or "",
                attempt=entry["attempt"], last_step=entry.get("last_step"),
                checkpoint_step=entry.get("checkpoint_step"), checkpoint_path=entry.get("checkpoint_path") or "",
                steps_lost=entry.get("steps_lost") or 0,
                steps_lost_is_lower_bound=bool(entry.get("steps_lost_is_lower_bound")),
                step_s=entry.get("step_s"), gpus=gpus,
                resubmitted_at=datetime.fromisoformat(entry["resubmitted_at"]),
            )  # fmt: skip
            row.gpu_hours_lost = _job_gpu_hours(row, recovery.detected_at, gpus)
            rows.append(row)
        RecoveryJob.objects.bulk_create(rows, ignore_conflicts=True)  # a re-run of the phase adds none twice
        first = resumed[0]
        _set(
            recovery,
            job_resubmitted_at=min(row.resubmitted_at for row in rows),
            checkpoint_step=first.get("checkpoint_step"),
            steps_lost=first.get("steps_lost"),
            steps_lost_is_lower_bound=bool(first.get("steps_lost_is_lower_bound")),
        )


def as_json(recovery: Recovery) -> dict:
    """The record as the API, the page and the `recovery` websocket event show it."""

    def iso(value):
        return value.isoformat() if value else None

    def seconds(value):
        return round((value - recovery.detected_at).total_seconds(), 3) if value else None

    return {
        "id": recovery.pk,
        "status": recovery.status,
        "phase": recovery.phase,
        "cause": recovery.cause,
        "failed_hosts": recovery.failed_hosts,
        "head_lost": recovery.head_lost,
        "replacement_hosts": recovery.replacement_hosts,
        "replacement_reason": recovery.replacement_reason,
        "waiting_reason": recovery.waiting_reason,
        "attempts": recovery.attempts,
        "message": recovery.message,
        "detected_at": iso(recovery.detected_at),
        "replacement_placed_at": iso(recovery.replacement_placed_at),
        "replacement_ready_at": iso(recovery.replacement_ready_at),
        "ready_at": iso(recovery.ready_at),
        "job_resubmitted_at": iso(recovery.job_resubmitted_at),
        "training_resumed_at": iso(recovery.training_resumed_at),
        "ended_at": iso(recovery.ended_at),
        "replacement_ready_s": seconds(recovery.replacement_ready_at),
        "ready_s": seconds(recovery.ready_at),
        "job_resubmitted_s": seconds(recovery.job_resubmitted_at),
        "training_resumed_s": seconds(recovery.training_resumed_at),
        "phases": recovery.phases,
        "jobs": recovery.jobs,
        "checkpoint_step": recovery.checkpoint_step,
        "steps_lost": recovery.steps_lost,
        "steps_lost_is_lower_bound": recovery.steps_lost_is_lower_bound,
        "gpu_hours_lost": recovery.gpu_hours_lost,
    }


def _announce(cluster: Cluster, recovery: Recovery) -> None:
    realtime.broadcast(f"cluster-{cluster.pk}", {"kind": "recovery", "recovery": as_json(recovery)})


# --- beat --------------------------------------------------------------------------------------------


def retry_recoveries() -> int:
    """Queue recover_cluster for: recoveries waiting for capacity; open recoveries whose worker stopped
    beating (VOLT_RECOVERY_STALE_S); DEGRADED clusters without one (when VOLT_AUTO_RECOVER). Returns how many."""
    stale = timezone.now() - timezone.timedelta(seconds=settings.VOLT_RECOVERY_STALE_S)
    ids: set[int] = set()
    for recovery in Recovery.objects.filter(status__in=RECOVERY_OPEN).select_related("cluster"):
        waiting = recovery.status == R.WAITING
        if (
            waiting
            or recovery.cluster.updated_at < stale
            or recovery.cluster.status
            not in (
                S.DEGRADED,
                S.RECOVERING,
            )
        ):
            ids.add(recovery.cluster_id)
    if settings.VOLT_AUTO_RECOVER:
        ids |= set(
            Cluster.objects.filter(status=S.DEGRADED)
            .exclude(recoveries__status__in=RECOVERY_OPEN)
            .values_list("pk", flat=True)
        )
    for cluster_id in sorted(ids):
        if cache.get(lock_key(cluster_id)) is None:
            queue(cluster_id)
    return len(ids)


def recoveries(cluster: Cluster):
    return cluster.recoveries.order_by("-detected_at", "-id").prefetch_related("job_rows")
