"""A cluster's place in the checkpoint store (issue 27; voltweb/object_store.py): an identity of its own that
the store confines to the cluster's prefix, granted before its nodes start and revoked when it ends. Its
jobs get the key in their environment and write checkpoints to `s3://<bucket>/<prefix>jobs/<id>/checkpoints`
(volt_ckpt through volt_store); Volt reads them back with the same key, never with more rights than the job.

Which clusters: every one when a store is configured (VOLT_STORE_*) and its nodes can reach it. Local hosts
reach VOLT_STORE_ENDPOINT as Volt does; SSH hosts reach it at VOLT_STORE_NODE_ENDPOINT, and without that
setting they keep checkpoints on the cluster's shared storage folder, as before.
"""

from __future__ import annotations

import logging

from django.conf import settings

from clusters.models import Cluster
from clusters.tenancy import ray_cluster_id
from inventory.choices import DriverKind
from voltweb import crypto, object_store

logger = logging.getLogger(__name__)


def identity_name(cluster: Cluster) -> str:
    """`volt-<install>-<pk>`: the cluster's user in the store (the name its Ray nodes carry)."""
    return ray_cluster_id(cluster)


def prefix(cluster: Cluster) -> str:
    return f"clusters/{ray_cluster_id(cluster)}/"


def node_endpoint(cluster: Cluster) -> str:
    """The store's endpoint as the cluster's nodes reach it; "" when they cannot (no store, or SSH hosts
    without VOLT_STORE_NODE_ENDPOINT)."""
    if not settings.VOLT_STORE_ENDPOINT:
        return ""
    if cluster.nodes.filter(host__driver=DriverKind.SSH).exists():
        return settings.VOLT_STORE_NODE_ENDPOINT
    return settings.VOLT_STORE_ENDPOINT  # local hosts reach it as Volt does


def ensure_identity(cluster: Cluster) -> bool:
    """Grant the cluster its identity (once) where its nodes can reach the store; True when it has one.
    Raises object_store.StoreUnavailable (the message says what to check) when the store refuses or is down."""
    if cluster.store_access_key:
        return True
    store = object_store.from_settings()
    if store is None or not node_endpoint(cluster):
        return False
    granted = store.grant(identity_name(cluster), prefix(cluster))
    Cluster.objects.filter(pk=cluster.pk).update(
        store_access_key=granted.access_key,
        store_secret_key_encrypted=crypto.encrypt(granted.secret_key),
    )
    cluster.refresh_from_db(fields=["store_access_key", "store_secret_key_encrypted"])
    return True


def revoke_identity(cluster: Cluster) -> list[str]:
    """The cluster has ended: its key stops working (its checkpoints stay, for the team). Problems, if any."""
    if not cluster.store_secret_key_encrypted:
        return []
    store = object_store.from_settings()
    if store is None:
        return ["the checkpoint store is no longer configured: its identity could not be revoked"]
    try:
        store.revoke(identity_name(cluster))
    except Exception as exc:  # noqa: BLE001 - a teardown reports, it does not stop
        return [f"checkpoint store identity {identity_name(cluster)}: {exc}"]
    # The key's id stays: it says the cluster's checkpoints are in the store (onray.checkpoint_dir).
    Cluster.objects.filter(pk=cluster.pk).update(store_secret_key_encrypted="")
    cluster.store_secret_key_encrypted = ""
    return []


def checkpoint_root(cluster: Cluster, *parts: str | int) -> str:
    """`s3://<bucket>/clusters/<name>/<parts...>`: a place under the cluster's prefix."""
    return "/".join([f"s3://{settings.VOLT_STORE_BUCKET}/{prefix(cluster).rstrip('/')}", *map(str, parts)])


def job_environment(cluster: Cluster) -> dict[str, str]:
    """VOLT_STORE_* for the cluster's jobs (volt_store reads them); {} without an identity (or once revoked)."""
    if not (cluster.store_access_key and cluster.store_secret_key_encrypted):
        return {}
    return {
        "VOLT_STORE_ENDPOINT": node_endpoint(cluster),
        "VOLT_STORE_REGION": settings.VOLT_STORE_REGION,
        "VOLT_STORE_ACCESS_KEY": cluster.store_access_key,
        "VOLT_STORE_SECRET_KEY": crypto.decrypt(cluster.store_secret_key_encrypted),
    }
