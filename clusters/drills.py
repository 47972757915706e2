"""Fault drills: break a node of a live cluster on purpose, to watch detection and recovery work.

Allowed to platform admins and the admins of the cluster's team (another team's cluster is not even
visible: 404, as everywhere); every drill is a line on the cluster's timeline with who ran it (audit).

    kill_processes     SIGKILL every process of this cluster on the node's host (its Ray node, the job's
                       workers): the watch sees "Ray node process not running" (the head: "not answering")
    ecc_uncorrectable  the node's host reports uncorrectable ECC errors on GPU 0 (inventory fault table)
    gpu_lost           GPU 0 of the host falls off the bus
    unreachable        the host stops answering its driver
    link_degraded      its links run at `value` % of their rate (emulated fabric only)
    link_flapping      its links go down and up every few seconds (emulated fabric only)
    ib_fallback        its links drop to the Ethernet class's rate (emulated fabric, InfiniBand only)

The fault drills are the inventory's fault table (inventory/drivers/faults.py) injected into a local host,
so they exist only where that table says they can be injected; `clear` removes one again (one a drill of
this cluster injected: a fault the provider put there is theirs).

Drills end with their cluster. Each is recorded (inventory.models.HostDrill) before it touches the host;
when the cluster ends, terminated or failed, the faults its drills injected are taken back and a cordon
recovery put on a host because of a drill is lifted once the host passes a health check
(inventory/drill_effects.py). A drill's effect on a provider's host is bounded by the team's own cluster.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser

from clusters import transitions
from clusters.choices import TERMINAL, ClusterStatus
from clusters.models import Cluster, ClusterNode
from clusters.provisioning import ray_nodes
from clusters.tenancy import node_driver, ray_cluster_id
from inventory import drill_effects
from inventory import services as inventory
from inventory.choices import DriverKind
from inventory.drivers import faults as fault_table
from inventory.drivers.base import DriverError
from inventory.models import HostDrill
from voltweb import services as accounts

S = ClusterStatus
KILL = "kill_processes"
FAULT_DRILLS = (
    "ecc_uncorrectable",
    "gpu_lost",
    "unreachable",
    "link_degraded",
    "link_flapping",
    "ib_fallback",
)
DRILLS = (KILL, *FAULT_DRILLS)
# A drill needs running nodes: the statuses in which a cluster has them.
DRILLABLE = (S.READY, S.DEGRADED, S.RECOVERING)


class DrillRefused(Exception):
    """The drill cannot run as asked; the message says what to do (a 400, or 403 when `forbidden`)."""

    def __init__(self, message: str, field: str = "non_field_errors", forbidden: bool = False):
        super().__init__(message)
        self.field = field
        self.forbidden = forbidden


@dataclass(frozen=True)
class DrillResult:
    drill: str
    host: str
    rank: int
    detail: str


def may_run_drills(user: AbstractBaseUser, cluster: Cluster) -> bool:
    """Platform admins and the admins of the cluster's team."""
    return accounts.is_team_admin(user, cluster.team)


def describe() -> list[dict]:
    """The drills, with what each does and whether it takes a value."""
    rows = [{"drill": KILL, "description": "SIGKILL every process of this cluster on the node's host",
             "value": None}]  # fmt: skip
    for name in FAULT_DRILLS:
        fault = fault_table.BY_NAME[name]
        value = fault.value.label if fault.value else None
        rows.append({"drill": name, "description": fault.description, "value": value})
    return rows


def run_drill(
    cluster: Cluster, user: AbstractBaseUser, drill: str, *, rank: int, value: str = "", clear: bool = False
) -> DrillResult:
    """Run (or, `clear`, undo) one drill on the node of `rank`. Raises DrillRefused.

    Only on a READY, DEGRADED or RECOVERING cluster, as stored now (not as the caller loaded it), and a
    terminate or failure cannot slip in between: the drill's row is committed before the host is touched
    (so a cluster end from then on undoes it) and the status is read again after (an end before that is
    undone here). Call it outside a transaction (a view, a task), or the row is not committed in time.
    """
    if not may_run_drills(user, cluster):
        raise DrillRefused(
            "Only platform admins and the admins of the cluster's team run drills.", forbidden=True
        )
    if drill not in DRILLS:
        raise DrillRefused(f"Unknown drill {drill!r}: choose one of {', '.join(DRILLS)}.", field="drill")
    status = _status(cluster)
    if status not in DRILLABLE:
        raise DrillRefused(
            f"The cluster is {status}: drills run on a ready, degraded or recovering cluster.", field="drill"
        )
    node = (
        ClusterNode.objects.active()
        .filter(cluster=cluster, rank=rank)
        .select_related("host__provider", "host__fabric")
        .first()
    )
    if node is None:
        ranks = sorted(cluster.nodes.active().values_list("rank", flat=True))
        raise DrillRefused(f"The cluster has no node of rank {rank}: its ranks are {ranks}.", field="rank")
    if drill == KILL:
        if clear:
            raise DrillRefused(
                "A killed process cannot be cleared: recovery replaces the node.", field="drill"
            )
        detail, row = _kill(cluster, node, user)
    elif clear:
        detail, row = _clear(cluster, node, drill, user), None
    else:
        detail, row = _fault(cluster, node, drill, value, user)
    status = _status(cluster)
    if row is not None and status not in DRILLABLE:
        _ended_meanwhile(cluster, status, row)
    verb = "cleared" if clear else "run"
    message = f"fault drill {verb} by {user.get_username()}: {drill} on {node.host.name} (rank {node.rank}): {detail}"
    transitions.note(cluster, message, actor=user, status=status)
    return DrillResult(drill, node.host.name, node.rank, detail)


def _status(cluster: Cluster) -> str:
    return Cluster.objects.filter(pk=cluster.pk).values_list("status", flat=True).first() or "deleted"


def _ended_meanwhile(cluster: Cluster, status: str, row) -> None:
    """The cluster began to end while the drill ran: its end may have undone the drills before this one
    touched the host, so this one is undone here, and refused."""
    drill_effects.take_back_drill(row, f"cluster {cluster.name} (#{cluster.pk}) {status}")
    if status in TERMINAL:
        end_drills(cluster)
    raise DrillRefused(
        f"The cluster became {status} while the drill ran: what it did was taken back. Drills run on a "
        "ready, degraded or recovering cluster.",
        field="drill",
    )


def _record(cluster: Cluster, node: ClusterNode, user, drill: str, fault: str = "", value: str = ""):
    """The drill's row, written before it touches the host: what it leaves is undone when the cluster ends."""
    return drill_effects.record_drill(
        node.host,
        cluster_pk=cluster.pk,
        cluster_name=cluster.name,
        team=cluster.team,
        actor=user,
        drill=drill,
        fault=fault,
        value=value,
    )


def _kill(cluster: Cluster, node: ClusterNode, user) -> tuple[str, HostDrill | None]:
    row = _record(cluster, node, user, KILL)
    pids: list[int] = []
    with node_driver(node.host) as driver:
        try:
            pids = ray_nodes.node_processes(driver, ray_cluster_id(cluster))
            if not pids:
                inventory.forget_drill(row)
                return "no process of this cluster was running there", None
            driver.run(
                f"kill -KILL {' '.join(shlex.quote(str(p)) for p in pids)} 2>/dev/null; true", timeout=20
            )
        except DriverError as exc:
            if not pids:  # nothing was killed: the drill did nothing to the host
                inventory.forget_drill(row)
            raise DrillRefused(f"{node.host.name} did not answer: {exc}", field="rank") from None
    return f"SIGKILL sent to {len(pids)} process(es)", row


def _local_host(node: ClusterNode, drill: str):
    host = node.host
    if host.driver != DriverKind.LOCAL:
        raise DrillRefused(
            f"{drill} is injected into local hosts only ({host.name} is an {host.driver} host); "
            f"use {KILL} there.",
            field="drill",
        )
    return host


def _fault(cluster: Cluster, node: ClusterNode, drill: str, value: str, user) -> tuple[str, HostDrill]:
    host = _local_host(node, drill)
    fault = fault_table.BY_NAME[drill]
    try:  # the inventory's own rule for what this fault takes, before anything else is asked
        given = inventory.fault_value(host, drill, value)
    except fault_table.FaultValueRefused as exc:
        raise DrillRefused(str(exc), field="value") from None
    number = int(given) if fault.value is not None and given else None
    kind = fault_table.HostKind(host.gpu_model, host.fabric.kind if host.fabric_id else "")
    problem = fault.problem(kind, number)
    if problem:
        raise DrillRefused(problem[1], field="value" if problem[0] == "fault_value" else "drill")
    # GPU faults default to GPU 0 (the drill's description), value faults to the number given.
    value = given if given and fault.value is None else fault.content(number)
    row = _record(cluster, node, user, drill, fault=drill, value=value)
    try:
        inventory.inject_fault(host, drill, value, actor=user, drill=row)
    except (ValueError, DriverError) as exc:
        inventory.forget_drill(row)
        raise DrillRefused(str(exc), field="drill") from None
    if not row.fault_held:
        return f"{host.name} had this fault already (not from a drill): it stays when the cluster ends", row
    return f"fault injected{f' ({value})' if value else ''}", row


def _clear(cluster: Cluster, node: ClusterNode, drill: str, user) -> str:
    host = _local_host(node, drill)
    if not inventory.drill_holds(host, cluster.pk, drill):
        raise DrillRefused(
            f"{host.name} has no {drill} fault from a drill of this cluster to clear: a fault its provider "
            "injected stays, and only they clear it.",
            field="drill",
        )
    try:
        inventory.clear_host_fault(host, drill, actor=user, reason=f"fault drill of cluster {cluster.pk}")
    except (ValueError, DriverError) as exc:
        raise DrillRefused(str(exc), field="drill") from None
    return "fault cleared"


def end_drills(cluster: Cluster) -> None:
    """The cluster ended (terminated, failed): nothing its drills did stays on its hosts (faults taken back,
    cordons after them lifted; inventory/drill_effects.py). Idempotent; every final path calls it."""
    cluster.refresh_from_db(fields=["status"])
    drill_effects.end_drills(cluster.pk, f"cluster {cluster.name} (#{cluster.pk}) {cluster.status}")


def clear_drill_faults(cluster: Cluster) -> None:
    """Before a final teardown: the faults the cluster's drills injected are taken back, so every one of its
    hosts answers again (an `unreachable` one refused the teardown's commands)."""
    drill_effects.clear_drill_faults(cluster.pk, f"cluster {cluster.name} (#{cluster.pk}) ending")
