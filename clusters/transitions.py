"""The cluster lifecycle: one table of allowed moves (DESIGN.md "Cluster lifecycle") and transition()."""

from __future__ import annotations

from clusters import hooks
from clusters.choices import ClusterStatus
from clusters.models import Cluster, ClusterEvent
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
        # The cluster watch (clusters/watch.py): a node failed its health rules or the head stopped answering.
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


def transition(cluster: Cluster, to: str, reason: str = "", extra: dict | None = None) -> Cluster:
    """Move `cluster` to `to` from an allowed status (else IllegalTransition), with a timeline event."""

    moved: list[str] = []

    def record(previous: str, target: str) -> None:
        message = reason or CLUSTER_TRANSITIONS[previous][target]
        ClusterEvent.objects.create(cluster=cluster, from_status=previous, to_status=target, message=message)
        moved[:] = [previous, target]

    def announce() -> None:
        realtime.broadcast(
            f"cluster-{cluster.pk}", {"kind": "status", "status": cluster.status, "reason": reason}
        )
        # Other apps (jobs) follow the cluster's status: registered in clusters/hooks.py.
        hooks.status_changed(cluster, moved[0], moved[1], reason or CLUSTER_TRANSITIONS[moved[0]][moved[1]])

    return statemachine.apply(
        cluster, to, CLUSTER_TRANSITIONS, field="status", extra=extra, record=record, after_commit=announce
    )
