"""The cluster lifecycle: one table of allowed moves (DESIGN.md "Cluster lifecycle"), transition(), and
the timeline's other lines: note() and requested(). These three are the only writers of ClusterEvent."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from clusters import hooks
from clusters.choices import ClusterStatus
from clusters.choices import RecoveryStatus as R
from clusters.models import Cluster, ClusterEvent, Recovery
from voltweb import realtime, statemachine

S = ClusterStatus
CLUSTER_TRANSITIONS: dict[str, dict[str, str]] = {
    S.PENDING: {
        S.PLACING: "placement task picked the request up",
        S.TERMINATED: "cancelled before placement",
        S.FAILED: "the request is invalid against the inventory",
    },
    S.PLACING: {
        S.PROVISIONING: "a plan was found and its GPUs allocated",
        S.QUEUED: "nothing fits now; waits for capacity",
        S.TERMINATED: "cancelled while placing",
        S.FAILED: "the request is invalid against the inventory",
    },
    S.QUEUED: {
        S.PLACING: "capacity changed; trying again",
        S.TERMINATED: "cancelled while queued",
        S.FAILED: "the request can never be met (e.g. its GPU model left the inventory)",
    },
    S.PROVISIONING: {
        S.VERIFYING: "every node joined; running the all-reduce probe",
        S.TERMINATING: "terminate requested",
        S.FAILED: "provisioning failed; allocations released",
    },
    S.VERIFYING: {
        S.READY: "probe passed",
        S.PROVISIONING: "slow or broken host replaced",
        S.TERMINATING: "terminate requested",
        S.FAILED: "verification failed",
    },
    S.READY: {
        # The cluster watch (clusters/telemetry/watch.py): a node failed its health rules or the head stopped answering.
        S.DEGRADED: "a node failed",
        S.TERMINATING: "terminate requested",
    },
    S.DEGRADED: {
        S.RECOVERING: "replacement placed",
        S.TERMINATING: "terminate requested",
        S.FAILED: "recovery impossible",
    },
    S.RECOVERING: {S.READY: "recovered", S.TERMINATING: "terminate requested", S.FAILED: "recovery failed"},
    S.TERMINATING: {S.TERMINATED: "every process stopped and GPU released"},
    S.TERMINATED: {},
    S.FAILED: {},
}


def no_reservation() -> dict:
    """What a cluster outside the queue holds of a reservation (clusters/reservations.py): nothing."""
    return {"reserved_from": None, "reserved_until": None, "reserved_hosts": [], "start_bound_note": ""}


def transition(cluster: Cluster, to: str, reason: str = "", extra: dict | None = None) -> Cluster:
    """Move `cluster` to `to` from an allowed status (else IllegalTransition), with a timeline event.

    A move past placement (provisioning, failed, terminated, …) drops the cluster's reservation in the
    same UPDATE: a cluster that left the queue never keeps a start bound, and the queue's planning needs no
    scan of the whole table for leftovers. PLACING keeps it: a placement that loses a race goes back to
    the queue with its bound."""
    if to not in (S.QUEUED, S.PLACING):
        extra = {**no_reservation(), **(extra or {})}

    moved: list[str] = []

    def record(previous: str, target: str) -> None:
        message = reason or CLUSTER_TRANSITIONS[previous][target]
        ClusterEvent.objects.create(cluster=cluster, from_status=previous, to_status=target, message=message)
        moved[:] = [previous, target]

    def announce() -> None:
        realtime.broadcast(
            f"cluster-{cluster.pk}", {"kind": "status", "status": cluster.status, "reason": reason}
        )
        realtime.overview_changed("cluster")
        # Other apps (jobs) follow the cluster's status: registered in clusters/hooks.py.
        hooks.status_changed(cluster, moved[0], moved[1], reason or CLUSTER_TRANSITIONS[moved[0]][moved[1]])

    return statemachine.apply(
        cluster, to, CLUSTER_TRANSITIONS, field="status", extra=extra, record=record, after_commit=announce
    )


def requested(cluster: Cluster) -> ClusterEvent:
    """The timeline's first line: the cluster was requested (PENDING)."""
    return ClusterEvent.objects.create(cluster=cluster, to_status=S.PENDING, message="requested")


def note(
    cluster: Cluster,
    message: str,
    *,
    actor: AbstractBaseUser | None = None,
    status: str | None = None,
    heartbeat: bool = False,
) -> ClusterEvent:
    """A timeline line that is not a status change, shown on the cluster's page as it happens.

    `status`: the cluster's status as the caller just read it (default: the row's in hand). `heartbeat`:
    also mark the cluster as making progress (provisioning's steps: the reaper re-sends a cluster whose
    `updated_at` stops moving)."""
    status = cluster.status if status is None else status
    event = ClusterEvent.objects.create(
        cluster=cluster, from_status=status, to_status=status, message=message, actor=actor
    )
    if heartbeat:
        Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
    realtime.broadcast(
        f"cluster-{cluster.pk}",
        {"kind": "timeline", "at": event.at.isoformat(), "status": status, "message": message},
    )
    return event


# A recovery's own lifecycle (clusters/recovery.py): claimed like a cluster's, so two workers cannot both
# end one, and an ended recovery is never re-opened or ended again.
RECOVERY_TRANSITIONS: dict[str, dict[str, str]] = {
    R.ACTIVE: {
        R.WAITING: "no replacement fits now; waits for capacity",
        R.SUCCEEDED: "recovered",
        R.FAILED: "recovery failed",
        R.ABANDONED: "the cluster was terminated",
    },
    R.WAITING: {
        R.ACTIVE: "capacity came: replacing",
        R.SUCCEEDED: "recovered (re-formed on the survivors)",
        R.FAILED: "recovery failed",
        R.ABANDONED: "the cluster was terminated",
    },
    R.SUCCEEDED: {},
    R.FAILED: {},
    R.ABANDONED: {},
}


def move_recovery(recovery: Recovery, to: str, **fields) -> Recovery:
    """Move a recovery to `to` from an allowed status (else IllegalTransition), writing `fields` in the same
    UPDATE. Its steps are on the cluster's timeline already (recovery.py notes each phase)."""
    return statemachine.apply(
        recovery, to, RECOVERY_TRANSITIONS, field="status", extra={**fields, "updated_at": timezone.now()}
    )
