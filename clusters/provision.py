"""Provisioning: from allocated GPUs to a verified Ray cluster, and back (DESIGN.md "Cluster lifecycle").

    PROVISIONING: cluster key pair → prepare every host in parallel (workspace, authorized key, shared
                  storage) → Ray head → workers in parallel → the head reports every node ALIVE
    VERIFYING:    the all-reduce probe runs on every host (clusters/probes/launch.py) → stored next to
                  the prediction, flagged when below VOLT_PROBE_MIN_FRACTION of it; a flagged cluster
                  whose probe names one host as the slowest gets it replaced (back to PROVISIONING, up
                  to VOLT_SLOW_HOST_REPLACEMENTS times) and is probed again
    READY:        credentials on the cluster (Ray address, dashboard, storage path, SSH key)

A host that cannot be prepared, whose node does not start or does not join, is cordoned as suspect and
its nodes are placed again near the survivors; when VOLT_PROVISION_ATTEMPTS run out the cluster is
FAILED with every node stopped, the key removed and every GPU released. Every step is idempotent
(`ray_nodes.start_*` return a node that already runs), so a redelivered task — or the reaper, after a
worker died — carries on where the last one stopped.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import F
from django.utils import timezone

from clusters import checkpoint_store, transitions
from clusters.choices import ClusterStatus, FailureReason
from clusters.models import Cluster
from clusters.provisioning.ending import (  # noqa: F401 - the face of provisioning/ for other modules
    fail,
    teardown,
)
from clusters.provisioning.nodes import (  # noqa: F401 - the face of provisioning/ for other modules
    BRINGING_UP,
    Abandoned,
    HostsFailed,
    active_nodes,
    assign_slots,
    bring_up,
    node_env,
    prepare_host,
    python_for,
    still_wanted,
)
from clusters.provisioning.replacement import (  # noqa: F401 - the face of provisioning/ for other modules
    NoReplacement,
    Replacement,
    near_survivors,
    refresh_plan,
    replace_hosts,
)
from clusters.provisioning.verification import (  # noqa: F401 - the face of provisioning/ for other modules
    probe_lock_key,
    probe_lock_s,
    run_probe,
    verify,
)
from clusters.tenancy import (  # noqa: F401 - ray_cluster_id, ensure_keys: re-exported for callers
    ensure_keys,
    ray_auth_token,
    ray_cluster_id,
    shared_storage_dir,
)
from inventory import local_runtime
from inventory.choices import DriverKind
from voltweb import object_store
from voltweb.statemachine import IllegalTransition

logger = logging.getLogger(__name__)
S = ClusterStatus


def provision_cluster(cluster_id: int) -> Cluster:
    """Bring a PROVISIONING cluster to READY (or FAILED); resume a VERIFYING one. Idempotent.

    Verification may send the cluster back to PROVISIONING once a slow host is replaced; the loop
    brings the new node up and probes again. A cluster terminated meanwhile is abandoned: whatever
    this task started is stopped again.
    """
    cluster = Cluster.objects.get(pk=cluster_id)
    try:
        for _ in range(settings.VOLT_SLOW_HOST_REPLACEMENTS + 2):
            if cluster.status == S.PROVISIONING:
                cluster = _provision_pass(cluster)
                if cluster.status != S.PROVISIONING:
                    return abandon(cluster)
                cluster = transitions.transition(
                    cluster, S.VERIFYING, "every node joined; running the all-reduce probe"
                )
            if cluster.status != S.VERIFYING:
                break
            cluster = verify(cluster)
            if cluster.status != S.PROVISIONING:
                break
    except (Abandoned, IllegalTransition):
        return abandon(cluster)
    return cluster


def _provision_pass(cluster: Cluster) -> Cluster:
    Cluster.objects.filter(pk=cluster.pk).update(
        provision_attempts=F("provision_attempts") + 1, updated_at=timezone.now()
    )
    if cluster.provisioning_started_at is None:
        Cluster.objects.filter(pk=cluster.pk).update(provisioning_started_at=timezone.now())
    return _bring_up_with_replacements(cluster)


def abandon(cluster: Cluster) -> Cluster:
    """Someone terminated the cluster meanwhile: stop what this task may have started after their teardown."""
    cluster = Cluster.objects.get(pk=cluster.pk)
    if cluster.status in (S.TERMINATING, S.TERMINATED, S.FAILED):
        started = list(cluster.nodes.filter(slot__isnull=False).select_related("host__provider"))
        teardown(cluster, started, final=True)
    return cluster


def _bring_up_with_replacements(cluster: Cluster) -> Cluster:
    attempts = settings.VOLT_PROVISION_ATTEMPTS
    if any(node.host.driver == DriverKind.LOCAL for node in active_nodes(cluster)):
        try:  # a runtime that does not match Volt's pins fails every host alike: no replacement helps
            local_runtime.python_for_local_hosts()
        except local_runtime.RuntimeMismatch as exc:
            return fail(cluster, FailureReason.CONFIG_INVALID, str(exc))
    try:  # before any node starts: a store that refuses or is down fails the cluster with nothing to undo
        if checkpoint_store.ensure_identity(cluster):
            transitions.note(
                cluster, f"checkpoints go to the store: {checkpoint_store.checkpoint_root(cluster)}/jobs/…"
            )
    except object_store.StoreUnavailable as exc:
        return fail(cluster, FailureReason.CONFIG_INVALID, f"no place for its checkpoints: {exc}"[:1000])
    except Exception as exc:  # noqa: BLE001 - whatever the store answered, the cluster fails cleanly
        logger.exception("cluster %s: granting its identity in the checkpoint store failed", cluster.pk)
        return fail(
            cluster, FailureReason.CONFIG_INVALID,
            f"no place for its checkpoints: the checkpoint store refused ({type(exc).__name__}: {exc})"[:1000],
        )  # fmt: skip
    for attempt in range(1, attempts + 1):
        try:
            bring_up(cluster)
            return Cluster.objects.get(pk=cluster.pk)
        except HostsFailed as failure:
            transitions.note(cluster, f"attempt {attempt}/{attempts}: {failure}", heartbeat=True)
            if attempt == attempts:
                return fail(
                    cluster, FailureReason.HOST_FAILED, f"gave up after {attempts} attempts: {failure}"
                )
            try:
                replace_hosts(cluster, failure.host_ids, str(failure))
            except NoReplacement as exc:
                return fail(cluster, FailureReason.HOST_FAILED, f"{failure}; {exc}")
    return Cluster.objects.get(pk=cluster.pk)
