"""Cluster operations: place a request (planning.py plans it, allocations.py takes its GPUs), the queue,
connection details, termination and the reapers.

Placement itself is the pure engine in clusters/placement/, fed by clusters/planning.py; this module
turns its plans into allocations. The partial unique index on Allocation(gpu) WHERE active is
the guarantee against double booking; the host row locks taken here only make conflicts rare.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from django.conf import settings as django_settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from clusters import (
    allocations,
    checkpoint_store,
    drills,
    hooks,
    locality,
    placement,
    planning,
    provision,
    quotas,
    recovery,
    reservations,
    tenancy,
    transitions,
)
from clusters.choices import HOLDS_GPUS, LIVE, TERMINAL, ClusterStatus, FailureReason
from clusters.models import Cluster, ClusterNode
from inventory import drill_effects
from inventory import services as inventory
from inventory.choices import DriverKind, HostState
from voltweb import crypto, realtime
from voltweb import services as accounts
from voltweb.domain import DomainError
from voltweb.models import Team
from voltweb.statemachine import IllegalTransition
from voltweb.taskutils import enqueue, enqueue_on_commit

logger = logging.getLogger(__name__)

S = ClusterStatus
PLACEMENT_ATTEMPTS = 5  # a racing request re-plans this often before it queues
DRAIN_BUDGET_S = 60.0  # one queue drain tries clusters this long (drain_queue_task's soft limit: 110 s)


# --- visibility --------------------------------------------------------------------------------------


def request_cluster(team: Team, user: AbstractBaseUser, spec: dict) -> Cluster:
    """Record a cluster request (PENDING) and queue its placement. planning.InvalidSpec if it can never fit
    the inventory; quotas.QuotaNeverFits (400) if it can never fit the team's quota."""
    quotas.never_fits(team, planning.validate_spec(spec))
    with transaction.atomic():
        cluster = Cluster.objects.create(
            team=team,
            created_by=user,
            name=spec.get("name") or "cluster",
            priority=spec.get("priority", 0),
            spec=spec,
        )
        transitions.requested(cluster)
        _queue_placement(cluster.pk)
    return cluster


def _queue_placement(cluster_id: int) -> None:
    enqueue_on_commit("clusters.tasks.place_cluster_task", cluster_id)


def place_cluster(cluster_id: int) -> Cluster:
    """Place a PENDING or QUEUED cluster: allocate its plan, or queue it with the binding reasons.

    Idempotent: a cluster in any other status is returned unchanged.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    if cluster.status not in (S.PENDING, S.QUEUED):
        return cluster
    try:
        first = None
        if cluster.status == S.QUEUED:
            place_now, first = _plan_queued(cluster)
            if not place_now:
                return Cluster.objects.get(pk=cluster_id)
        transitions.transition(cluster, S.PLACING, "placement started")
        return _place_placing(cluster, first)
    except IllegalTransition as exc:
        # Another worker got there first, or the cluster was terminated while it was being placed: the
        # row moved on, so this task's work is over (allocate() rolled back anything it wrote).
        logger.info("cluster %s: placement ends, the cluster is %s (%s)", cluster_id, exc.current, exc)
        return Cluster.objects.get(pk=cluster_id)


def _plan_queued(cluster: Cluster) -> tuple[bool, placement.Plan | None]:
    """A queued cluster tried again (the queue drains every 30 s and on every release): (whether to
    place it now, the plan that fits if one was made).

    Still waiting writes no timeline event and changes no status: it keeps the one "waiting for
    capacity" event of when it was queued, and only a reason that changed is stored and announced. (A
    retry used to go QUEUED -> PLACING -> QUEUED: two events and two status broadcasts each time.) A
    spec that no longer validates goes the usual way, to FAILED with its problems.
    """
    try:
        request, over_quota = quotas.narrow(cluster.team, planning.validate_spec(cluster.spec))
        result = placement.Refusal((over_quota,)) if over_quota else _plan_within_locality(cluster, request)
    except planning.InvalidSpec:
        return True, None  # _place_placing fails it, naming the problems
    if isinstance(result, placement.Plan):
        return True, result
    reason = "; ".join(result.reasons) or "no capacity"
    if reason != cluster.queue_reason:
        changed = Cluster.objects.filter(pk=cluster.pk, status=S.QUEUED).update(
            queue_reason=reason, plan=planning.plan_as_json(result), updated_at=timezone.now()
        )
        if changed:  # the page re-reads its reason on a status event
            event = {"kind": "status", "status": S.QUEUED, "reason": reason}
            transaction.on_commit(lambda: realtime.broadcast(f"cluster-{cluster.pk}", event))
    return False, None


def _place_placing(cluster: Cluster, first: placement.Plan | None = None) -> Cluster:
    """Plan and allocate a PLACING cluster, or queue or fail it. IllegalTransition if it moved meanwhile.
    `first`: a plan just made for it (a queued cluster's retry), allocated before planning again."""
    try:
        request = planning.validate_spec(cluster.spec)
    except planning.InvalidSpec as exc:
        return _fail(cluster, FailureReason.CONFIG_INVALID, "; ".join(exc.problems))
    request, over_quota = quotas.narrow(cluster.team, request)  # models without room left out
    if over_quota:
        return _enqueue(cluster, placement.Refusal((over_quota,)))
    for attempt in range(PLACEMENT_ATTEMPTS):
        result = first if attempt == 0 and first is not None else _plan_within_locality(cluster, request)
        if isinstance(result, placement.Refusal):
            return _enqueue(cluster, result)
        try:
            return allocations.allocate(cluster, result)
        except allocations.CapacityChanged as exc:
            logger.info("cluster %s: %s; re-planning", cluster.pk, exc)
        except quotas.OverQuota as exc:  # a racing placement of the team took the room first
            return _enqueue(cluster, placement.Refusal((str(exc),)))
    refusal = placement.Refusal(("capacity kept changing while placing; retrying from the queue",))
    return _enqueue(cluster, refusal)


def _plan_within_locality(cluster: Cluster, request: placement.PlacementRequest):
    """plan_request, with the request's locality wait applied while it holds (clusters/locality.py): the
    wait's level required, and a refusal saying what it waits for and until when. Past the bound, the
    request as written, and a plan wider than it waited for carries the warning."""
    now = timezone.now()
    avoid, windows = reservations.avoid_for(cluster, now)  # hosts reserved for requests ahead
    span = reservations.span_of(cluster, now)
    if span is not None and not locality.could_tighten(request, span):
        span = None  # it already requires as tight a span (or none could hold it): planned as written
    if span is not None:  # it holds a reservation in one site: until it starts, only one site will do
        result = planning.plan_request(locality.at_level(request, span), cluster.team_id, avoid)
        if isinstance(result, placement.Refusal):
            line = f"it starts on its reservation in one {span} by {cluster.reserved_from:%Y-%m-%d %H:%M} UTC"
            result = _name_reservations(result, windows, cluster)
            return replace(result, reasons=(line, *result.reasons))
        return result
    wait = locality.current_wait(cluster.spec, request, cluster.created_at, now)
    if wait is not None:
        result = planning.plan_request(locality.narrowed(request, wait), cluster.team_id, avoid)
        if isinstance(result, placement.Refusal):
            result = _name_reservations(result, windows, cluster)
            reasons = "; ".join(result.reasons) or "no capacity"
            return placement.Refusal((locality.waiting_reason(wait, reasons),), result.explanation)
        return result
    result = planning.plan_request(request, cluster.team_id, avoid)
    if isinstance(result, placement.Refusal):
        return _name_reservations(result, windows, cluster)
    if isinstance(result, placement.Plan):
        warning = locality.waited_warning(
            cluster.spec, request, result.spanned_level, cluster.created_at, timezone.now()
        )
        if warning:
            result = replace(result, explanation=(*result.explanation, placement.WARNING_PREFIX + warning))
    return result


def _name_reservations(refusal: placement.Refusal, windows, cluster: Cluster) -> placement.Refusal:
    """A refusal that had to leave reserved hosts alone says so (and why: its duration, or none)."""
    if not windows:
        return refusal
    line = reservations.avoided_line(windows, reservations.duration_of(cluster.spec))
    return replace(refusal, reasons=(*refusal.reasons, line), explanation=(*refusal.explanation, line))


def _enqueue(cluster: Cluster, refusal: placement.Refusal) -> Cluster:
    reason = "; ".join(refusal.reasons) or "no capacity"
    extra = {"queue_reason": reason, "plan": planning.plan_as_json(refusal)}
    if cluster.queued_at is None:
        extra["queued_at"] = timezone.now()
    return transitions.transition(cluster, S.QUEUED, f"waiting for capacity: {reason}", extra=extra)


def _fail(cluster: Cluster, reason: str, message: str) -> Cluster:
    allocations.release(cluster)
    return transitions.transition(
        cluster,
        S.FAILED,
        message,
        extra={"failure_reason": reason, "failure_message": message, "ended_at": timezone.now()},
    )


def connection_details(cluster: Cluster, viewer: AbstractBaseUser | None = None) -> dict | None:
    """The READY hand-off: what a researcher (or a pipeline) needs to use the cluster.

    The cluster's Ray token is in it only for `viewer`s who are members of the cluster's team (a
    platform admin who is not gets a placeholder); list views pass no viewer.
    """
    if cluster.status not in (S.READY, S.DEGRADED, S.RECOVERING) or not cluster.ray_address:
        return None
    token = cluster_ray_token(cluster) if viewer is not None and is_team_member(viewer, cluster) else None
    shown = token or "<the cluster's Ray token: shown to its team on the cluster's page>"
    head = next((n for n in cluster.nodes.all() if n.is_head and n.released_at is None), None)
    storage = tenancy.storage_location(cluster)
    tunnel = None
    submit_to = cluster.dashboard_url
    if head is not None and head.host.driver == "ssh":
        # The head's dashboard listens on its private address: the team reaches it as Volt does, through an
        # SSH forward. The cluster's key forwards ports only (tenancy.AUTHORIZED_KEY_OPTIONS): no shell.
        user = head.host.ssh_user or "root"
        target = cluster.dashboard_url.removeprefix("http://").rstrip("/")
        tunnel = f"ssh -i volt-cluster-{cluster.pk}.key -N -L 8265:{target} -p {head.host.ssh_port} {user}@{head.host.address}"
        submit_to = "http://127.0.0.1:8265"
    return {
        "ray_address": cluster.ray_address,
        "dashboard_url": cluster.dashboard_url,
        "job_submission_address": cluster.dashboard_url,
        "ssh_command": tunnel,
        "storage_path": storage,
        "ssh_key_url": f"/api/v1/clusters/{cluster.pk}/ssh-key/",
        "ray_auth_token": token,
        "snippet": (
            "# the cluster refuses calls without its token (Ray token authentication)\n"
            + (
                f"# the head's dashboard is private to its provider's network: first, in another shell\n{tunnel}\n"
                if tunnel
                else ""
            )
            + f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN={shown}\n"
            f"RAY_ADDRESS={submit_to} ray job submit --working-dir . -- python train.py\n"
            f"# or from Python:\nfrom ray.job_submission import JobSubmissionClient\n"
            f'client = JobSubmissionClient("{submit_to}", '
            f'headers={{"Authorization": "Bearer {shown}"}})\n'
            f'client.submit_job(entrypoint="python train.py", runtime_env={{"working_dir": "."}})\n'
            f"# checkpoints: write them under {storage} (shared by every node)"
        ),
    }


def is_team_member(user: AbstractBaseUser, cluster: Cluster) -> bool:
    """Whether `user` belongs to the cluster's team (platform admins are not members by their role)."""
    return bool(user.is_authenticated) and cluster.team.memberships.filter(user=user).exists()


def cluster_ray_token(cluster: Cluster) -> str:
    """The cluster's Ray token in clear, for its team and Volt's own calls ("" before provisioning)."""
    return tenancy.ray_auth_token(cluster)


def record_training_resumed(cluster_id: int, job_id: int, attempt: int, at) -> bool:
    """A resubmitted job stepped again: its recovery's record counts its lost GPU-hours up to `at`."""
    return recovery.training_resumed(cluster_id, job_id, attempt, at)


def cluster_private_key(cluster: Cluster) -> str:
    """The cluster's SSH private key (OpenSSH), for Volt's own use; people get it via download_cluster_key."""
    return crypto.decrypt(cluster.ssh_private_key_encrypted)


class KeyNotYours(DomainError):
    """Only members of the cluster's team download its key (platform admins included: not theirs)."""

    code = "team_members_only"
    status = 403


def download_cluster_key(cluster: Cluster, user: AbstractBaseUser) -> str:
    """The cluster's private key for a member of its team, audited on the cluster's timeline.

    Returns "" while the cluster has no key yet (nothing is audited then). Raises KeyNotYours for
    anyone outside the team: a platform admin sees every cluster but holds no team's key.
    """
    if not accounts.is_team_member(user, cluster.team):
        raise KeyNotYours(
            f"Only members of {cluster.team.name} download this cluster's SSH key; platform admins see "
            "every cluster but do not hold teams' keys."
        )
    key = cluster_private_key(cluster)
    if key:
        # An audit line, not a step of the lifecycle: no status.
        transitions.note(
            cluster, f"SSH private key downloaded by {user.get_username()}", actor=user, status=""
        )
    return key


def terminate_cluster(
    cluster: Cluster, actor: AbstractBaseUser | None = None, *, wait: bool = False
) -> Cluster:
    """Cancel a waiting cluster at once; send a running one to TERMINATING.

    Stopping its Ray processes, removing its key and freeing its GPUs is host work, so a worker does it
    (terminate_cluster_task, after commit; the reaper re-sends it if that worker dies). `wait=True`
    does it in this call instead: for workers, scripts and tests, never a web request.
    """
    if cluster.status in (S.PENDING, S.PLACING, S.QUEUED):
        return transitions.transition(
            cluster, S.TERMINATED, f"cancelled by {actor or 'system'}", extra={"ended_at": timezone.now()}
        )
    if cluster.status not in LIVE:
        raise IllegalTransition(cluster, cluster.status, S.TERMINATING)
    cluster = transitions.transition(
        cluster, S.TERMINATING, f"terminate requested by {actor or 'system'}; stopping its Ray processes"
    )
    if wait:
        return finish_termination(cluster)
    enqueue_on_commit("clusters.tasks.terminate_cluster_task", cluster.pk)
    return cluster


def finish_termination(cluster: Cluster) -> Cluster:
    """Stop every process the cluster started (only on hosts where provisioning reached), then release.

    Its jobs are stopped first (hooks registered by the jobs app), so they end STOPPED with the reason.
    """
    hooks.before_teardown(cluster)

    drills.clear_drill_faults(cluster)  # a host its drill made `unreachable` answers the teardown again
    started = list(cluster.nodes.filter(slot__isnull=False).select_related("host__provider"))
    if started:
        problems = provision.teardown(cluster, started, final=True)
    else:  # ended before any node started: its user (made before the hosts were prepared) may exist
        problems = tenancy.remove_node_user(cluster)
    allocations.release(cluster)
    detail = f"; could not reach {'; '.join(problems)}" if problems else ""
    cluster = transitions.transition(
        cluster,
        S.TERMINATED,
        f"Ray processes stopped and GPUs released{detail}",
        extra={"ended_at": timezone.now()},
    )
    drills.end_drills(cluster)  # cordons after its drills lifted: they end with the cluster
    return cluster


# --- the queue ---------------------------------------------------------------------------------------


def queued() -> QuerySet[Cluster]:
    """Queued clusters in placement order: priority first, then first come first served."""
    return Cluster.objects.queued()


def queue_position(cluster: Cluster) -> int | None:
    """1-based position in the queue, or None when not queued (annotated by lists: no query then)."""
    if cluster.status != S.QUEUED:
        return None
    if hasattr(cluster, "queue_position"):
        return cluster.queue_position
    return Cluster.objects.with_queue_position().values_list("queue_position", flat=True).get(pk=cluster.pk)


def drain_queue(budget_s: float = DRAIN_BUDGET_S) -> int:
    """Give the queue's first requests their reservations (start bounds: clusters/reservations.py), then
    try every queued cluster in priority then FIFO order; returns how many were placed.

    A cluster that still does not fit stays queued (quietly: _plan_queued) and the next one is tried: it
    starts if it fits outside every reservation it would overlap (backfill), so a small request can start
    while large ones wait, but never on hosts a request ahead of it counts on. Stops after `budget_s`; the
    next drain starts from the head again.
    """
    deadline = time.monotonic() + budget_s
    placed = tried = 0
    reservations.schedule()
    ids = list(queued().values_list("id", flat=True))
    for cluster_id in ids:
        if time.monotonic() > deadline:
            logger.warning(
                "queue drain stopped after %.0f s: %d of %d queued clusters tried", budget_s, tried, len(ids)
            )
            break
        cluster = place_cluster(cluster_id)
        placed += cluster.status in HOLDS_GPUS
        tried += 1
    return placed


def reap_stuck_provisioning(older_than_s: int | None = None) -> int:
    """PROVISIONING/VERIFYING/TERMINATING with no progress past the deadline: the worker died. Re-queue.

    Provisioning steps are idempotent and beat `updated_at` as they go, so the new task carries on.
    """
    stale_s = django_settings.VOLT_PROVISION_STALE_S if older_than_s is None else older_than_s
    deadline = timezone.now() - timezone.timedelta(seconds=stale_s)
    stuck = Cluster.objects.filter(
        status__in=[S.PROVISIONING, S.VERIFYING, S.TERMINATING], updated_at__lt=deadline
    )
    count = 0
    for cluster in stuck:
        Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
        task = "terminate_cluster_task" if cluster.status == S.TERMINATING else "provision_cluster_task"
        enqueue(f"clusters.tasks.{task}", cluster.pk)
        count += 1
    return count


def reap_cluster_leftovers(limit: int = 5) -> dict:
    """What ended clusters could not undo at their end, tried again: their Unix user (a host that did not
    answer, a process that would not die), what they left on SSH hosts that were off (_clean_returned_hosts),
    their key in the checkpoint store (a store that did not answer) and their drills' faults and cordons (a
    worker that died between the final status and their end).
    `limit` users and clusters per run, least recently tried first (one that keeps failing goes to the
    back). Returns counts."""
    pending = (
        Cluster.objects.filter(status__in=TERMINAL, node_user_removed_at__isnull=True)
        .exclude(node_user="")
        .order_by("updated_at", "pk")[:limit]
    )
    users = 0
    for cluster in pending:
        problems = tenancy.remove_node_user(cluster)
        if problems:
            Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
            logger.warning("cluster %s: its Unix user is still there: %s", cluster.pk, "; ".join(problems))
        else:
            users += 1
            transitions.note(
                cluster, f"Unix user {cluster.node_user} removed (it could not be at the end)", heartbeat=True
            )
    hosts = _clean_returned_hosts(limit)
    keys = _revoke_store_keys(limit)
    ended = 0
    open_pks = inventory.open_drill_cluster_pks()
    live = set(
        Cluster.objects.filter(pk__in=open_pks).exclude(status__in=TERMINAL).values_list("pk", flat=True)
    )
    for cluster_pk in sorted(open_pks - live):
        cluster = Cluster.objects.filter(pk=cluster_pk).first()
        if cluster is not None:
            drills.end_drills(cluster)
        else:  # deleted: its drills end all the same
            drill_effects.end_drills(cluster_pk, f"cluster #{cluster_pk} deleted")
        ended += 1
    return {"node_users_removed": users, "hosts_cleaned": hosts, "store_keys_revoked": keys,
            "clusters_drills_ended": ended}  # fmt: skip


def _revoke_store_keys(limit: int) -> int:
    """Ended clusters whose checkpoint store key still works (the store did not answer their final teardown):
    revoke it now, `limit` a run, least recently tried first. Returns how many were revoked."""
    pending = (
        Cluster.objects.filter(status__in=TERMINAL)
        .exclude(store_secret_key_encrypted="")
        .order_by("updated_at", "pk")[:limit]
    )
    revoked = 0
    for cluster in pending:
        problems = checkpoint_store.revoke_identity(cluster)
        if problems:
            Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
            logger.warning(
                "cluster %s: its checkpoint store key still works: %s", cluster.pk, "; ".join(problems)
            )
        else:
            revoked += 1
            transitions.note(
                cluster, "checkpoint store key revoked (the store did not answer at the end)", heartbeat=True
            )
    return revoked


def _clean_returned_hosts(limit: int) -> int:
    """SSH hosts that did not answer their cluster's final teardown (a machine that was off) still hold its
    processes, Unix user, key and workdir: try again, `limit` clusters a run, least recently tried first.
    Retired and offline hosts are not tried. Returns how many hosts were cleaned."""
    dirty = (
        ClusterNode.objects.filter(
            cluster__status__in=TERMINAL,
            cleaned_at__isnull=True,
            slot__isnull=False,
            host__driver=DriverKind.SSH,
        )
        .exclude(host__state__in=[HostState.RETIRED, HostState.OFFLINE])
        .order_by("cluster__updated_at", "cluster_id")
        .values_list("cluster_id", flat=True)
    )
    cleaned = 0
    for cluster_pk in list(dict.fromkeys(dirty))[:limit]:
        cluster = Cluster.objects.get(pk=cluster_pk)
        nodes = list(
            cluster.nodes.filter(cleaned_at__isnull=True, slot__isnull=False, host__driver=DriverKind.SSH)
            .exclude(host__state__in=[HostState.RETIRED, HostState.OFFLINE])
            .select_related("host__provider")
        )
        problems = provision.teardown(cluster, nodes, final=True)  # stamps cleaned_at where it worked
        done = set(
            cluster.nodes.filter(pk__in=[n.pk for n in nodes], cleaned_at__isnull=False).values_list(
                "host__name", flat=True
            )
        )
        cleaned += len(done)
        if done:
            transitions.note(
                cluster,
                f"cleaned up on {', '.join(sorted(done))}, which did not answer at its end",
                heartbeat=True,
            )
        if problems:
            Cluster.objects.filter(pk=cluster.pk).update(updated_at=timezone.now())
    return cleaned


def reap_stuck_placing(older_than_s: int = 120) -> int:
    """PLACING past the deadline means the worker died mid-placement: queue the cluster again.

    Allocation is one transaction, so a cluster still PLACING holds no GPUs and is safe to re-place.
    """
    deadline = timezone.now() - timezone.timedelta(seconds=older_than_s)
    reaped = 0
    for cluster in Cluster.objects.filter(status=S.PLACING, updated_at__lt=deadline):
        try:
            _enqueue(cluster, placement.Refusal(("placement was interrupted; retrying",)))
            reaped += 1
        except IllegalTransition:
            continue
    if reaped:
        allocations.kick_queue()
    return reaped
